"""The sweep's state on the shared FS: cells, queue files and the roster (`cells`), the ledger of
launched prefixes (`ledger`), one typed snapshot with the single liveness rule (`snapshot`),
every cell's state (`classify`) and the controller lock (`lock`).
"""
