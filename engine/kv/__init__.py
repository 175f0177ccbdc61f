"""The KV layer: the cell map (cell <-> position <-> token) and the cache of one
sequence, the only caller of ``seq_rm`` and ``seq_shift``."""
