-- Where each process can be reached (issue 15 §1): the console on the writer fetches every
-- process's readiness from the URL its lease row advertises. Set at acquisition, never renewed.
ALTER TABLE arkvory_gateway_leases ADD COLUMN url text;
