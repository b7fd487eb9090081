"""The pages, in the order of the sidebar. Page files live in ``pages/``."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

ROOT = Path(__file__).resolve().parent.parent

# name -> (title, icon)
PAGES: dict[str, tuple[str, str]] = {
    "overview": ("Overview", ":material/dashboard:"),
    "sources": ("Sources and pull", ":material/cloud_download:"),
    "dag": ("Partition DAG", ":material/account_tree:"),
    "watermarks": ("Watermarks", ":material/water:"),
    "transactions": ("Transactions", ":material/receipt_long:"),
    "records": ("Records", ":material/table_rows:"),
    "sql": ("SQL", ":material/terminal:"),
}


def page(name: str) -> st.Page:
    title, icon = PAGES[name]
    return st.Page(ROOT / "pages" / f"{name}.py", title=title, icon=icon, url_path=name,
                   default=name == "overview")


def all_pages() -> list[st.Page]:
    return [page(name) for name in PAGES]
