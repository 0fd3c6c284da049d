-- Account names are unique without regard to case (SPEC §5, issue 22): `bob` and `BOB` are one
-- name, for sign-in, the login limits and the device cookies alike. The fold is ASCII lowering,
-- `lower(name COLLATE "C")`, the same in Python (writer/identity/account_names.py says why no other).
--
-- A database that already holds names differing only in case cannot get the index: the migration
-- refuses, naming them (at most 20 groups), and the writer does not start until an operator has
-- renamed all but one of each. RAISE gives SQLSTATE P0001, which db.migrate reports as a one-line
-- refusal (exit 78), not as a database failure.
DO $$
DECLARE
    groups integer;
    listed text;
BEGIN
    SELECT count(*), string_agg(spellings, ', ' ORDER BY folded) FILTER (WHERE rank <= 20)
      INTO groups, listed
      FROM (
        SELECT lower(name COLLATE "C") AS folded,
               string_agg(quote_literal(name), ' and ' ORDER BY name COLLATE "C") AS spellings,
               row_number() OVER (ORDER BY lower(name COLLATE "C")) AS rank
          FROM arkvory_accounts
         GROUP BY lower(name COLLATE "C")
        HAVING count(*) > 1
      ) twins;
    IF groups > 0 THEN
        RAISE EXCEPTION 'account names are now unique without regard to case, and these differ only in case: %',
            listed || CASE WHEN groups > 20 THEN ' and ' || (groups - 20) || ' more groups' ELSE '' END
        USING HINT = 'rename all but one of each, e.g. UPDATE arkvory_accounts SET name = ''bob-2'' WHERE name = ''BOB'';'
                     ' then start the writer again';
    END IF;
END
$$;

CREATE UNIQUE INDEX arkvory_accounts_name_folded ON arkvory_accounts (lower(name COLLATE "C"));
