-- A stand-in: 0013 is another branch's (i22-creds, credential makers). It only keeps this
-- branch's migrations in sequence; the merge drops this file for that one.
SELECT 1;
