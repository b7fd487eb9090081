"""Data and URL values inside Streamlit's markdown and Plotly's hover text, as plain text.

Streamlit renders the body of ``st.markdown``, ``st.caption``, ``st.error``, ``st.info``,
``st.title``, button and link labels... as GitHub-flavoured markdown (links, images, autolinks,
``:material/...:`` icons, ``:red[...]`` colours, ``$...$`` maths). Every value that comes from
the cache or the URL goes through :func:`md` before it joins such a text; the page's own words
stay markdown. Plotly renders ``<a href>``, ``<b>``... in text and hover templates: values go
through :func:`html` first.
"""

from __future__ import annotations

import re
import string
from typing import Any

from spark_backend.analysis.display import html  # noqa: F401  (for Plotly labels)

_PUNCT = frozenset(string.punctuation)


ZWSP = "\u200b"
_WWW = re.compile(r"(www)(?=\\\.)", re.IGNORECASE)


def md(value: Any) -> str:
    """``value`` as markdown that shows its characters: every ASCII punctuation character
    backslash-escaped (CommonMark allows it for all of them), so no link, image, emphasis, code,
    directive or maths can form; newlines become spaces. GFM autolinks form on the text after
    escapes (``http://x``, ``www.x``, ``a@b.c``): a zero-width space after ``:`` and ``@`` and
    inside ``www.`` breaks them without changing what is seen."""
    text = str(value).replace("\r", " ").replace("\n", " ")
    out = "".join("\\" + ch + (ZWSP if ch in ":@" else "") if ch in _PUNCT else ch
                  for ch in text)
    return _WWW.sub(r"\1" + ZWSP, out)

