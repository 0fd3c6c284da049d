"""What the writer keeps about artifacts (SPEC §6): repositories, their artifacts, packages,
assets and the accounts' permissions on them, with their routes.

    repositories.py  repositories, and what the catalog's changes share (the repository found
                     for a change, its artifact, its JSON form)
    artifacts.py     list, show and delete an artifact; its name rule and JSON form
    packages.py      group/name/version pointing at an artifact
    assets.py        a named path pointing at an artifact, with history
    permissions.py   accounts' read/write/admin on a repository
    retention.py     a repository's retention rule and its preview (the dry run)
    retention_rules.py  what a retention rule keeps, and the query of what it deletes

May import: arkvory.shared (never its cli/), the writer's basics and identity/.
"""
