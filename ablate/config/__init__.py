"""What the user wrote: `ablate.yaml` and profiles parsed once into frozen dataclasses
(`project`), the sections added per issue (`settings`) and `ablate init`'s template (`scaffold`).
"""
