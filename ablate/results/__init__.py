"""Commands about results and teardown: `pull`, `reconcile`, `remediate` and the `release` gate.
"""
