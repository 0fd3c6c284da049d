-- Placeholder (issue 7): filled in by the change that needs it; kept so the numbering is fixed.
SELECT 1;
