"""Who is asking: the token an `Authorization` header carries, Bearer or Basic (authorization.py),
keys-file tokens and principals (identity.py), and the database credentials (sessions, personal
tokens, managed service keys) with their cache (credentials.py).

May import: the basics, http/, storage/ and cluster/. Never download/, process/ or cli/: a
caller hands credentials.resolve the parts it reads (the key ring, the cache, the pool), not the
process.
"""
