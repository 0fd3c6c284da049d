"""The numbered SQL migrations (NNNN_name.sql), applied in order by the writer (db.migrate).

No Python lives here: package-data ships the .sql files.
"""
