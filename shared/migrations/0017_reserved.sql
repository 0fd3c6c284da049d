-- A stand-in: 0017 is another branch's (issue 25: i25-accounts, account deletion and reset). It only keeps
-- this branch's migrations in sequence; the merge drops this file for that one.
SELECT 1;
