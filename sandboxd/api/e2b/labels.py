"""The labels the E2B facade puts on the sessions it makes: a sandbox's template, a context's sandbox. They live
under one prefix a client's metadata may not use."""

from __future__ import annotations

OWN_PREFIX = "sandboxd.e2b/"
TEMPLATE_LABEL = OWN_PREFIX + "template"  # every sandbox carries it: what makes a session a sandbox
PARENT_LABEL = OWN_PREFIX + "sandbox"  # an extra code context: the sandbox it belongs to
LANGUAGE_LABEL = OWN_PREFIX + "language"  # an extra code context's language, when not python
IMAGE_LABEL = OWN_PREFIX + "image"  # a sandbox of a custom template: a container session of that image ("1")
OPEN_LABEL = OWN_PREFIX + "open"  # created with secure: false, where the node serves those: reached by its id ("1")
