"""The entrypoint: `streamlit run app/main.py`.

Owns st.navigation and the state every page shares: the cache, the stream, the range, the
stall threshold, the walkthrough. With an empty cache it pulls the demo world by itself.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ICON = Path(__file__).resolve().parent / "icon.png"
if str(ROOT) not in sys.path:  # `streamlit run app/main.py` puts app/ first, not the project
    sys.path.insert(0, str(ROOT))
# The package sets Arrow's allocator option first; pyarrow is not loaded before this script.
import spark_backend  # noqa: E402, F401, I001

import streamlit as st  # noqa: E402
from streamlit import config as st_config  # noqa: E402

from app import import_roots, live, nav, resources, state, widgets  # noqa: E402
from app.live import LIVE_EMULATOR_PREFIX, LIVE_PREFIX  # noqa: E402
from app.safe import md  # noqa: E402

# Where the server may listen without being asked: loopback only. The project's
# .streamlit/config.toml says so, and app/.streamlit/config.toml (a link to it) makes Streamlit
# read it wherever `streamlit run` is started. Another address counts only when the user set it
# (a flag, STREAMLIT_SERVER_ADDRESS, or a config file of their own): see README "Serving".
LOOPBACK = {"localhost", "127.0.0.1", "::1"}


def _served_where_asked() -> bool:
    address = (st_config.get_option("server.address") or "").strip()
    if address in LOOPBACK:
        return True
    return st_config.get_where_defined("server.address") != "<default>"
from spark_backend.model.errors import InspectorError  # noqa: E402

# The Sources page's buttons that start a live stream -> the prefix of the stream they start.
LIVE_STARTS = {"live_start": LIVE_PREFIX, "live_emu_start": LIVE_EMULATOR_PREFIX}


def _open(path: str) -> str | None:
    """Open (or create) the cache; the error sentence when it cannot be used."""
    try:
        resources.open_cache(path)
    except InspectorError as e:
        return str(e)
    except Exception as e:  # a file that is not DuckDB, a folder, no permission...
        return f"Cannot use {path} as a cache: {str(e).splitlines()[0]}"
    return None


def _bootstrap(path: str) -> None:
    """An empty cache: pull the demo world in time slices on a background thread
    (``app.bootstrap``); once the first slice has landed the pages show it, and the Overview
    follows the rest as it lands."""
    boot = resources.bootstrap_of(path)
    if boot is None and (resources.streams(path) or st.session_state.get("bootstrapped")):
        return
    if boot is not None and (boot.slices_done or boot.error or not boot.running):
        if boot.error:
            st.error(md(boot.error))
        return
    st.session_state["bootstrapped"] = True
    boot = resources.start_bootstrap(path)  # returns at once; its thread starts Spark
    with st.status("The cache is empty: pulling the demo world…", expanded=True) as box:
        line = st.empty()
        bar = st.progress(0.0)
        while boot.running and not boot.slices_done:
            bar.progress(boot.fraction)
            line.text(boot.progress_text())
            time.sleep(0.5)
        if boot.error:
            box.update(label=md(boot.error), state="error")
            return
        box.update(label="The first part of the demo world is cached.", state="complete")
    st.switch_page(nav.page("overview"))


def _sidebar_cache() -> str:
    default = st.session_state.setdefault("cache_path", resources.default_cache_path())
    path = st.sidebar.text_input("Cache file", value=default, key="cache_path_input",
                                 help="A DuckDB file; env CSI_CACHE sets the default.")
    path, refused = import_roots.cache_choice(path, default)
    if refused:
        st.sidebar.error(md(refused))
    st.session_state["cache_path"] = path
    return path


def _live_start_asked(page: st.Page) -> str | None:
    """In the run where a Sources button starting a live stream was clicked: the stream's name,
    reserved now and shown from now on (sidebar, URL, links), while the page starts it."""
    if page.url_path != "sources" or st.session_state.get("cache_error"):
        return None
    for key, prefix in LIVE_STARTS.items():
        if st.session_state.get(key) is True:
            name = live.reserve_stream_name(time.time_ns(), prefix)
            st.session_state["live_pending"] = name
            state.choose_stream(name)
            return name
    return None


def _pending_live(names: list[str]) -> str | None:
    """The live stream this session asked for that is starting and not cached yet; None when
    there is none (it landed, or its start ended without landing anything)."""
    name = st.session_state.get("live_pending")
    if name is None:
        return None
    if live.is_starting(name, resources.live_runner(name)):
        return name
    del st.session_state["live_pending"]
    if name not in names and state.param("stream") == name:
        state.set_param("stream", None)
    return None


def _sidebar_stream(path: str) -> tuple[str | None, bool]:
    """The stream shown, and whether it is a live stream still starting (not cached yet)."""
    names = resources.streams(path)
    pending = _pending_live(names)
    if pending is not None and pending not in names:
        names = [*names, pending]
    if not names:
        return None, False
    chosen = state.take_chosen_stream()
    if chosen in names:  # a page chose it (e.g. a sample just imported)
        state.set_param("stream", chosen)
        # a new key: the selectbox starts again at `index` (the browser keeps an old key's value)
        st.session_state["stream_pick_n"] = st.session_state.get("stream_pick_n", 0) + 1
    wanted = state.param("stream")
    if wanted and wanted not in names:
        st.sidebar.error(md(f"No stream {wanted!r} in this cache; showing {names[0]}."))
    index = names.index(wanted) if wanted in names else 0
    stream = st.sidebar.selectbox("Stream", names, index=index,
                                  key=f"stream_select_{st.session_state.get('stream_pick_n', 0)}")
    state.set_param("stream", stream)
    return stream, stream == pending


def _sidebar_range() -> tuple[int | None, int | None]:
    bounds = []
    for name, label in (("start", "Range start"), ("end", "Range end")):
        text = st.sidebar.text_input(label, value=state.param(name) or "", key=f"range_{name}",
                                     placeholder="whole cached range (RFC 3339)")
        try:
            bounds.append(state.parse_range_bound(text, label))
            state.set_param(name, text.strip() or None)
        except ValueError as e:
            st.sidebar.error(md(str(e)))
            bounds.append(None)
    if bounds[0] is not None and bounds[1] is not None and bounds[0] > bounds[1]:
        st.sidebar.error("Range end: it is before the range start; showing the whole range.")
        return None, None
    return bounds[0], bounds[1]


def _sidebar_walkthrough(c: state.Ctx) -> None:
    on = st.sidebar.toggle("Walkthrough", value=bool(st.session_state.get("walkthrough")),
                           help="A guided tour of the demo world.")
    st.session_state["walkthrough"] = on
    if not on or c.stream is None or c.starting:
        return
    steps = widgets.walkthrough_steps(c)
    found = widgets.current_step(steps)
    if found is None:
        st.sidebar.caption("Nothing to show in this stream yet.")
        return
    index, step = found
    st.sidebar.markdown(f"**Step {index + 1} of {len(steps)}: {md(step.title)}**")
    back, forward = st.sidebar.columns(2)
    if back.button("◀ Back", disabled=index == 0, key="wt_back"):
        widgets.go_to_step(steps, index - 1)
    if forward.button("Next ▶", disabled=index == len(steps) - 1, key="wt_next"):
        widgets.go_to_step(steps, index + 1)
    if st.sidebar.button("Show this step", key="wt_show"):
        widgets.go_to_step(steps, index)


def main() -> None:
    # A local icon: a material or emoji icon would be fetched from a font CDN on every page.
    st.set_page_config(page_title="Change stream inspector", page_icon=str(ICON),
                       layout="wide")
    if not _served_where_asked():
        st.error("This server listens on every network interface, which nobody asked for "
                 "(the project's .streamlit/config.toml was not read); restart it with "
                 "`--server.address 127.0.0.1`, or see README \"Serving\" to serve on another "
                 "address on purpose.")
        st.stop()
    navigation = st.navigation(nav.all_pages())
    st.sidebar.title("Change stream inspector")
    path = _sidebar_cache()
    error = _open(path)
    st.session_state["cache_error"] = error
    stream, start_ns, end_ns, version, starting = None, None, None, 0, False
    asked = None
    if error:
        st.sidebar.error(md(error))
    else:
        _bootstrap(path)
        asked = _live_start_asked(navigation)
        version = resources.version(path)
        stream, starting = _sidebar_stream(path)
        if stream is not None:
            start_ns, end_ns = _sidebar_range()
    stall, stall_error = state.stall_threshold(
        state.LIVE_STALL_S if stream and stream.startswith(LIVE_PREFIX) else None)
    if stall_error:
        st.sidebar.error(md(stall_error))
    c = state.Ctx(path, version, stream, start_ns, end_ns, stall, starting=starting)
    state.set_ctx(c)
    _sidebar_walkthrough(c)
    try:
        navigation.run()
    finally:
        # A start that never began (interrupted, or refused before its runner existed) frees
        # its name; the next run then shows what was shown before.
        if asked is not None:
            live.cancel_reservation(asked)


main()
