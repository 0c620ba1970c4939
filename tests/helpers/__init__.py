"""What the tests share; test modules import from here, never from each other or from conftest.

    cli               the in-process CLI runner behind the `cli` fixture, and `python -m ablate` as a
                      separate process (`ablate_process`, `ablate_cmd` for a shell)
    project           LocalProject (a small real project on the local transport), its events and
                      live tmux sessions
    wait              wait_for: poll a condition until a deadline
    tmux              require_tmux, Pane (a shell in a real tmux pane, driven by keys)
    results           result dirs fabricated exactly as run_one publishes them
    testbed_projects  projects on the SSH test bed (tests/testbed.py) and what its FS records
    fault_train       the trainer of the fault suite, copied to the test bed and run there by path

tests/testbed.py (the namespace test bed itself) stays beside the tests: scripts/bench_*.py
import it as `tests.testbed`.
"""
