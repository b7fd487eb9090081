"""Sources and pull: choose a source, a range and a heartbeat; pull with live progress; what is
cached per stream; refresh a live stream on a timer."""

import time
from datetime import timedelta

import streamlit as st

from app import import_roots, live, nav, pulling, resources, samples, state, widgets
from app.formatting import ns_column
from app.safe import md
from spark_backend.model import config
from spark_backend.model.errors import InspectorError

c = state.ctx()
widgets.walkthrough_banner("sources")
st.title("Sources and pull")
errors: dict[str, str] = st.session_state.get("pull_errors", {})


def field_error(name: str) -> None:
    if errors.get(name):
        st.error(md(errors[name]))


form = pulling.PullForm()
form.source = st.radio("Source", list(pulling.SOURCES), format_func=pulling.SOURCES.get,
                       horizontal=True, key="src_source")
field_error("source")
left, right = st.columns(2)
with left:
    form.stream = st.text_input("Stream name in the cache", key="src_stream",
                                placeholder="DemoStream" if form.source == "demo" else "")
    field_error("stream")
    if form.source == "spanner":
        form.project = st.text_input("Project", key="src_project")
        field_error("project")
        form.instance = st.text_input("Instance", key="src_instance")
        field_error("instance")
        form.database = st.text_input("Database", key="src_database")
        field_error("database")
    if form.source in ("spanner", "emulator"):
        form.source_stream = st.text_input("Change stream at the source", key="src_sstream")
        field_error("source_stream")
    if form.source != "files":
        form.dialect = st.selectbox("Dialect", pulling.DIALECTS, key="src_dialect",
                                    format_func=pulling.DIALECT_LABELS.get)
        field_error("dialect")
    else:
        form.file_format = st.selectbox("Format", pulling.FILE_FORMATS, key="src_format")
        field_error("file_format")
        n = st.session_state.get("src_upload_n", 0)  # a new key empties the uploader
        form.uploads = st.file_uploader(
            "Upload files", accept_multiple_files=True, key=f"src_upload_{n}",
            help=f"Up to {st.get_option('server.maxUploadSize')} MB a file "
                 "(Streamlit's server.maxUploadSize); kept in a private temporary folder "
                 "only while the import runs.") or []
        root = import_roots.import_root()
        form.paths = st.text_area(
            "Files or folders under the import folder, one per line", key="src_paths",
            placeholder="off: no import folder" if root is None else "datastream/events.jsonl",
            help=f"Relative to the import folder `{import_roots.IMPORT_ROOT_ENVVAR}`, named "
                 "when the dashboard started; nothing outside it is read.")
        st.caption(md(f"This page reads {import_roots.accepted()}."))
        field_error("paths")
with right:
    if form.source != "files":
        form.start = st.text_input("Start (RFC 3339)", key="src_start",
                                   placeholder="the source's earliest (demo: 09:00)")
        field_error("start")
        form.end = st.text_input("End (RFC 3339)", key="src_end", placeholder="now")
        field_error("end")
        form.heartbeat_ms = st.number_input(
            "Heartbeat (ms)", min_value=0, max_value=10 * config.MAX_HEARTBEAT_MS,
            value=config.DEFAULT_HEARTBEAT_MS, step=1000, key="src_heartbeat")
        field_error("heartbeat_ms")

go = st.button("Pull" if form.source != "files" else "Import", type="primary", key="src_go")
field_error(pulling.GENERAL)
if go:
    errors = pulling.validate(form)
    if not errors and st.session_state.get("cache_error"):
        errors = {pulling.GENERAL: st.session_state["cache_error"]}
    if not errors:
        with st.status("Pulling…", expanded=True) as box:
            bar, line = st.progress(0.0), st.empty()

            def show(p) -> None:
                bar.progress(pulling.progress_fraction(p))
                line.text(pulling.progress_text(p))

            with resources.pull_lock(c.path):
                outcome = pulling.pull(resources.open_cache(c.path), form, show,
                                       prepare=resources.prepare_pull)
            box.update(label=md(outcome.message), state="complete" if outcome.ok else "error")
        if outcome.ok:
            st.session_state["pull_message"] = outcome.message
            if form.uploads:
                st.session_state["src_upload_n"] = st.session_state.get("src_upload_n", 0) + 1
        else:
            errors = {outcome.field: outcome.message}
    st.session_state["pull_errors"] = errors
    st.rerun()
if st.session_state.get("pull_message") and not errors:
    st.success(md(st.session_state["pull_message"]))

st.subheader("Load a sample")
st.caption("Other systems' files from `fixtures/samples/`, each into its own stream, "
           "which the sidebar then shows.")
clicked = None
for col, sample in zip(st.columns(len(samples.SAMPLES)), samples.SAMPLES, strict=True):
    if col.button(sample.label, key=sample.key, help=sample.help, width="stretch"):
        clicked = sample
if clicked is not None:
    if st.session_state.get("cache_error"):
        st.session_state["sample_outcome"] = (False, st.session_state["cache_error"])
    else:
        with st.status(md(f"Importing {clicked.label}…"), expanded=True) as box:
            line = st.empty()
            with resources.pull_lock(c.path):
                outcome = samples.load(resources.open_cache(c.path), clicked, line.text)
            box.update(label=md(outcome.message), state="complete" if outcome.ok else "error")
        st.session_state["sample_outcome"] = (outcome.ok, outcome.message)
        if outcome.ok:
            state.choose_stream(clicked.stream)
    st.rerun()
if st.session_state.get("sample_outcome"):
    ok, message = st.session_state["sample_outcome"]
    (st.success if ok else st.error)(md(message))

st.subheader("Live demo")
st.caption("The demo world replayed against the clock, 4× faster than life: partitions split "
           "and merge every few tens of seconds, and one partition goes silent 30 s after the "
           "start and speaks again 90 s later. It is served by a local Spanner-protocol server "
           "and pulled every 5 s into a stream of its own (only the new span is read); the "
           "Overview follows it live. It plays for about 8 minutes (the rest of the recorded "
           "hour).")
runners = resources.live_runners()
running = [r for r in runners.values() if r.running]
l1, l2 = st.columns([1, 3])
if l1.button("Start the live demo", key="live_start", type="primary",
             disabled=bool(st.session_state.get("cache_error"))
             or any(r.source == "demo" for r in running)):
    with st.spinner("Starting the live world and its first pull…"):
        runner = resources.start_live_demo(c.path)
        for _ in range(240):  # the first pull lands the stream; then the Overview follows it
            if runner.ticks or not runner.running:
                break
            time.sleep(0.5)
    state.choose_stream(runner.stream)
    st.switch_page(nav.page("overview"), query_params={"stream": runner.stream})
for r in running:
    if r.source == "demo" and l2.button(md(f"Stop {r.stream}"), key=f"live_stop_{r.stream}"):
        r.stop()
        st.rerun()

st.subheader("Live emulator")
st.caption("A local Cloud Spanner emulator, started here and kept running with a bank-transfer "
           "workload; its change stream partitions split and merge every 5 to 10 s. Every 5 s "
           "the stream is pulled from where it was read to up to a second ago, through the same "
           "emulator (only the new span is read); the Overview follows it live. Stop ends the "
           "refreshes, the workload and the emulator; the stream stays cached.")
e1, e2 = st.columns([1, 3])
if e1.button("Start the live emulator", key="live_emu_start",
             disabled=bool(st.session_state.get("cache_error"))
             or any(r.source == "emulator" for r in running)):
    st.session_state.pop("live_emu_error", None)
    with st.spinner("Starting the emulator, its workload and the first pull…"):
        try:
            runner = resources.start_live_emulator(c.path)
        except InspectorError as e:
            runner = None
            st.session_state["live_emu_error"] = str(e)
        for _ in range(240 if runner is not None else 0):
            if runner.ticks or not runner.running:
                break
            time.sleep(0.5)
    if runner is None:
        st.rerun()
    state.choose_stream(runner.stream)
    st.switch_page(nav.page("overview"), query_params={"stream": runner.stream})
if st.session_state.get("live_emu_error"):
    st.error(md(st.session_state["live_emu_error"]))
for r in running:
    if r.source == "emulator" and e2.button(md(f"Stop {r.stream}"), key=f"live_stop_{r.stream}"):
        with st.spinner("Stopping the refreshes, the workload and the emulator…"):
            r.stop()
        st.rerun()
for r in runners.values():
    st.text(r.status())

st.subheader("Cached streams")
if st.session_state.get("cache_error"):
    st.error(md(st.session_state["cache_error"]))
    st.stop()
cached = resources.cached_streams(c.path, c.version)
if cached.empty:
    st.info("Nothing cached yet.")
else:
    shown = cached.assign(range_start=ns_column(cached["range_start_ns"]),
                          range_end=ns_column(cached["range_end_ns"]))
    st.dataframe(shown.drop(columns=["range_start_ns", "range_end_ns"]), hide_index=True,
                 width="stretch")
    with st.expander("Pulls"):
        st.dataframe(widgets.with_datetimes(resources.pulls(c.path, c.version, None)),
                     hide_index=True, width="stretch")

    st.subheader("Refresh a live stream")
    r1, r2, r3 = st.columns([2, 1, 1])
    live_name = r1.selectbox("Stream", list(cached["stream"]), key="live_stream")
    every = r2.number_input("Every (seconds)", 10, 3600, 60, key="live_every")
    on = r3.toggle("Refresh on a timer", key="live_on")
    info = cached[cached["stream"] == live_name].iloc[0].to_dict()
    refused = live.refusal(info)
    if refused:
        st.info(md(refused))
    else:
        st.caption("Each refresh pulls from the cached end to now from the same database: only "
                   "the new span is read.")

    @st.fragment(run_every=timedelta(seconds=int(every)) if on and not refused else None)
    def refresher() -> None:
        if not st.session_state.get("live_on") or refused:
            return
        refresh = pulling.refresh_form(info)
        with resources.pull_lock(c.path):
            outcome = pulling.pull(resources.open_cache(c.path), refresh, lambda p: None,
                                   prepare=resources.prepare_pull)
        (st.success if outcome.ok else st.error)(
            md(f"{pulling.now_text()[:19]}Z · {outcome.message}"))

    refresher()
