"""A Griffe extension: the reST roles of attnlab's docstrings read as code on the site.

The docstrings are written for ``help()`` and the terminal, with Sphinx roles such as
``:func:`capture``` and ``:class:`~attnlab.inspect.ActivationCache```. Markdown has no roles, so
each becomes inline code holding the name as written (``~`` keeps only the last part, as in
Sphinx): ```capture```, ```ActivationCache```. A paragraph that introduces an indented block with
reST's ``::`` ends in one ``:`` on the site (Markdown already reads the indented block as code).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj):`(~?)([^`]+)`")
LITERAL_BLOCK = re.compile(r"(?<=\S)::$", re.MULTILINE)  # "text::" before an indented block


def _code(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


class ReSTRoles(griffe.Extension):
    """Rewrite ``:role:`target``` as inline code in every docstring."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = ROLE.sub(_code, obj.docstring.value)
            obj.docstring.value = LITERAL_BLOCK.sub(":", text)
