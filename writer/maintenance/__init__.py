"""Storage maintenance: the cleanup and verify task kinds and the offline repair tools."""
