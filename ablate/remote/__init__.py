"""The Python that runs on the instances, stdlib-only at import, one sub-package per subsystem:

- `queue`: the runner, run_queue's decisions for a queue's life (shipped as the runner's zipapp);
- `checkpoints`: verification that never runs a file's code (shipped with the probe);
- `store`: the instance's side of a sweep kept in an object store;
- `slurm`: the Slurm batch adapter's decisions and a job's time-limit and signal arithmetic;
- `host`: the probe (many-file reads as one JSON document, small ordered writes) and the host agent;

and `layout`, the sweep root's paths, which all of them and the controller share. What each
shipped artefact carries is exactly the modules its entry imports (tests/test_shipped_code.py);
the controller imports the very same modules, so the two cannot drift.
"""
