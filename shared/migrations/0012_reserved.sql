-- A stand-in: 0012 is another branch's (i22-identity, account names folded). It only keeps this
-- branch's migrations in sequence; the merge drops this file for that one.
SELECT 1;
