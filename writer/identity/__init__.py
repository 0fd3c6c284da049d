"""Who may act on the writer (SPEC §5): accounts and their names, sign-in and its limits,
sessions, personal tokens, managed service keys, who made each credential and what ends it.

    accounts.py          login, logout, sign-up, password change, disable/enable; the account routes
    accounts_openapi.py  their OpenAPI fragment
    account_lifecycle.py an administrator's view of one account, password reset, and delete
    lockout.py           what keeps an installation from disabling or deleting its way out
    account_names.py     an account name's shape and its one folded form
    sign_in_guard.py     what a login or sign-up request must be (JSON, not from another site)
    login_limits.py      password guessing limits per address, account and device
    device_cookies.py    the device cookies that keep a known client's way in
    passwords.py         scrypt, off the event loop
    tokens.py            personal tokens
    service_keys.py      managed service keys (and adopting a suspended one)
    credential_makers.py who made a token or key, and what ends it with its maker

May import: arkvory.shared (never its cli/) and the writer's basics (idempotency, openapi,
pagination, request_inputs). tests/test_layout.py holds the writer's layers.
"""
