"""The dashboard's figures live in ``spark_backend.analysis.figures`` (shared with the HTML
report); this name stays for the pages.

The pages draw them with ``st.plotly_chart(theme="streamlit")``, which takes backgrounds, grid
and text from the active light or dark theme; a colour a figure sets itself must read on both.
``lag_over_time_figure`` here draws the low watermark in a mid grey for that reason (the shared
figure's near-black line, right on the white HTML report, vanishes on a dark page).
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from spark_backend.analysis import figures as _shared
from spark_backend.analysis.figures import *  # noqa: F403
from spark_backend.analysis.figures import (  # noqa: F401
    CLICKABLE_BARS,
    EDGE_COLOUR,
    HIGHLIGHT,
    STATUS_COLOUR,
    dag_figure,
    lag_figure,
    txn_count_figure,
    txn_density_figure,
    txn_figure,
)

# Mid grey: contrast about 3.7:1 on white and 5:1 on the dark theme's #0e1117.
LOW_WATERMARK_COLOUR = "#80868b"


def lag_over_time_figure(*args: Any, **kwargs: Any) -> go.Figure:
    """``spark_backend.analysis.figures.lag_over_time_figure`` with the low watermark's line in
    a colour that reads on the light and the dark theme."""
    fig = _shared.lag_over_time_figure(*args, **kwargs)
    fig.update_traces(selector=dict(name="low watermark"), line_color=LOW_WATERMARK_COLOUR)
    return fig
