"""The metadata quorum (KRaft after KIP-500/595/631) on pysyncobj.

``records`` (metadata record schemas and their msgpack codec), ``image`` (the pure
``MetadataImage`` and its deltas) and ``controller`` (pure controller decisions) do no I/O.
``quorum`` is the only importer of pysyncobj. May import ``storage``, never ``node``.
"""
