"""Leaf helpers with no knowledge of sweeps: atomic local writes (`fs`), human formats (`fmt`)
and progress output on stderr (`progress`).
"""
