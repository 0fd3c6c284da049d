-- A stand-in: 0017 is another branch's (i25-accounts). It only keeps this branch's migrations in
-- sequence; the merge drops this file for that one.
SELECT 1;
