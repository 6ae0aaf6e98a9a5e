"""envd's Connect-RPC services as E2B's SDK speaks them: the message and service modules generated from envd's
``process.proto`` and ``filesystem.proto`` (protoc-gen-py / protoc-gen-connectrpc-py), copied verbatim from
the ``e2b`` 2.45.1 wheel (MIT, (c) FoundryLabs, Inc.), so the wire format is the SDK's own, not hand-rolled.
Regenerate by copying ``e2b/envd/{process,filesystem}/*_{pb,connect}.py`` from the pinned SDK version."""
