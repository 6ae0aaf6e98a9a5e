"""Container images on a node: imported once (``sandboxd image import``), their layers unpacked by content into
the node's store and shared by every image that has them (``store.py``), each layer unpacked so that nothing
an archive holds is written outside it (``unpack.py``), from an OCI layout or a ``docker save`` archive
(``sources.py``)."""
