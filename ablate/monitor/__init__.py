"""Commands that watch a sweep: `status`, its live dashboard (`watch`), live host data (GPUs,
log progress: `hostinfo`) and `logs`.
"""
