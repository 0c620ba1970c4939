"""The Python that runs on the instances, stdlib-only at import: the sweep root's path layout
(`layout`), the many-file reads answered as one JSON document (`probe`) and verification that
never runs a file's code (`verify`). The ssh transport ships this package, content-addressed, to
`<root>/lib/<sha12>/`; the controller imports the very same modules, so the two cannot drift.
"""
