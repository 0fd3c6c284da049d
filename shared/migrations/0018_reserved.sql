-- A stand-in: 0018 is another branch's (issue 25: i25-retention, retention rules). It only keeps
-- this branch's migrations in sequence; the merge drops this file for that one.
SELECT 1;
