"""The demo launched for real (in this process, on 127.0.0.1 and a free port, the tiny model on the CPU) and called the
way clients call it: raw HTTP on Gradio's queue routes, and gradio_client. Checked: the queue's bounds (``--max-queue``
and ``--per-client``), that a request whose client leaves stops at the next step and lets the next one run, and that a
malformed call is refused in one line with no traceback in the server's log."""

from __future__ import annotations

import inspect
import json
import threading
import time
from typing import Any, Dict, List, Optional

import pytest

from npu_port.demo import app, formatting
from npu_port.demo.__main__ import free_port
from npu_port.demo.admission import QueueLimits
from npu_port.demo.choices import StrategyChoices
from npu_port.demo.payload import MalformedCall
from npu_port.upstream.gradio import QueueView

#: What the pages offer (and one they list as unavailable: a call naming it is refused with the reason).
CHOICES = StrategyChoices(
    ["auto", "sdpa", "vanilla"], {"ascend-910b": "needs an Ascend NPU: torch_npu is not installed"}
)
#: Where generate's timings are among its outputs (image shown, its size label, the download, timings, explanation).
INFO = 3
NAMES = ("prompt", "negative_prompt", "steps", "seed", "height", "width", "guidance_scale", "strategy")


def values(**overrides) -> List[Any]:
    """The Generate form's values in the order the page sends them."""
    form = dict(
        prompt="a red fox",
        negative_prompt="",
        steps=2,
        seed=0,
        height=64,
        width=64,
        guidance_scale=4.0,
        strategy="sdpa",
    )
    form.update(overrides)
    return [form[name] for name in NAMES]


def wait_for(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def launch(tiny, tmp_path, monkeypatch):
    """``launch(**build_demo_arguments) -> (demo, url)``: the demo of the tiny model, served until the test ends."""
    pytest.importorskip("gradio")
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio"))
    started = []

    def start(**arguments):
        demo = app.build_demo(tiny, choices=CHOICES, **arguments)
        started.append(demo)
        _, url, _ = demo.launch(
            server_name="127.0.0.1", server_port=free_port("127.0.0.1"), prevent_thread_lock=True, quiet=True
        )
        return demo, url

    yield start
    for demo in started:
        demo.close()


class Steps:
    """Counts the denoising steps the tiny model runs and calls ``at(n)`` at the n-th (which may hold it there)."""

    def __init__(self, monkeypatch, loaded, at=lambda n: None):
        scheduler = type(loaded.pipe.scheduler)
        original = scheduler.step
        self.count = 0

        def step(this, *args, **kwargs):
            self.count += 1
            at(self.count)
            return original(this, *args, **kwargs)

        monkeypatch.setattr(scheduler, "step", step)


class Client:
    """One client of the queue over raw HTTP: its session, the requests it joins, the messages its event stream
    brings (read in a thread). ``leave`` set: after a request of it starts, it waits for ``leave`` and then closes
    its stream, as a closed page or a killed program does."""

    def __init__(self, url: str, demo: Any, session: str, leave: Optional[threading.Event] = None):
        import httpx

        self.url, self.session, self.leave = url, session, leave
        self.index = {fn.api_name: key for key, fn in _functions(demo).items()}
        self.http = httpx.Client(timeout=120)
        self.messages: List[Dict[str, Any]] = []
        self.reader: Optional[threading.Thread] = None

    def join(self, data: List[Any], endpoint: str = "generate", fn_index: Optional[int] = None):
        response = self.http.post(
            self.url + "gradio_api/queue/join",
            json={
                "data": data,
                "fn_index": self.index[endpoint] if fn_index is None else fn_index,
                "session_hash": self.session,
            },
        )
        if response.status_code == 200 and self.reader is None:
            self.reader = threading.Thread(target=self._read, daemon=True)
            self.reader.start()
        return response

    def _read(self) -> None:
        with self.http.stream("GET", self.url + "gradio_api/queue/data", params={"session_hash": self.session}) as s:
            for line in s.iter_lines():
                if not line.startswith("data:"):
                    continue
                message = json.loads(line[5:])
                self.messages.append(message)
                if message.get("msg") == "process_starts" and self.leave is not None:
                    self.leave.wait(60)
                    return  # leaving the block closes the connection
                if message.get("msg") == "close_stream":
                    return

    def completed(self) -> List[Dict[str, Any]]:
        return [m for m in self.messages if m.get("msg") == "process_completed"]

    def close(self) -> None:
        if self.reader is not None:
            self.reader.join(timeout=60)
        self.http.close()


def _functions(demo) -> Dict[int, Any]:
    return demo.fns if isinstance(demo.fns, dict) else dict(enumerate(demo.fns))


@pytest.mark.slow
def test_the_queue_holds_at_most_max_queue_waiting_and_per_client_per_client(launch, tiny, monkeypatch):
    demo, url = launch(queue_limits=QueueLimits(max_queue=2, per_client=2))
    view = QueueView(demo)
    release = threading.Event()
    steps = Steps(monkeypatch, tiny, at=lambda n: release.wait(60))  # the first request holds the slot
    a, b, c = (Client(url, demo, session) for session in "abc")
    try:
        assert a.join(values()).status_code == 200
        wait_for(lambda: steps.count >= 1, "a's first request to run")
        assert a.join(values()).status_code == 200  # waits: a holds 2, its limit
        refused = a.join(values())
        assert refused.status_code == 429
        assert refused.json() == {
            "detail": "this client already has 2 requests waiting or running, the most one client may have "
            "(--per-client 2); wait for one to finish"
        }
        assert view.jobs("a") == 2  # the refused one never entered the queue
        assert b.join(values()).status_code == 200  # another client is not affected: 2 waiting now
        full = c.join(values())  # gradio's own bound, max_size
        assert full.status_code == 503 and full.json()["detail"].startswith("Queue is full. Max size is 2")
        release.set()
        wait_for(lambda: len(a.completed()) == 2 and len(b.completed()) == 1, "the three requests to finish")
        assert all(m["success"] and m["output"]["data"][INFO].startswith("**Strategy:**") for m in a.completed())
        assert view.jobs("a") == 0
        again = Client(url, demo, "a")  # what finished no longer counts against a
        assert again.join(values()).status_code == 200
        wait_for(lambda: len(again.completed()) == 1, "a's next request")
        again.close()
    finally:
        release.set()
        for client in (a, b, c):
            client.close()
    assert steps.count == 4 * 2


@pytest.mark.slow
def test_a_request_whose_client_leaves_stops_at_the_next_step_and_the_next_one_runs(launch, tiny, monkeypatch, capfd):
    demo, url = launch(queue_limits=QueueLimits(max_queue=4, per_client=1))
    view = QueueView(demo)
    leave = threading.Event()
    noticed = []

    def at(step):
        if step == 2:  # a's second step: a leaves now, and the step ends once gradio has seen it go
            leave.set()
            started = time.monotonic()
            while not view.left("a") and time.monotonic() - started < 30:
                time.sleep(0.02)
            noticed.append(view.left("a"))

    steps = Steps(monkeypatch, tiny, at=at)
    a, b = Client(url, demo, "a", leave=leave), Client(url, demo, "b")
    try:
        assert a.join(values(steps=50, strategy="vanilla")).status_code == 200
        wait_for(lambda: steps.count >= 1, "a's request to run")
        assert b.join(values(steps=3)).status_code == 200  # waits behind a's 50 steps
        wait_for(lambda: len(b.completed()) == 1, "b's request, after a's stopped", timeout=120)
    finally:
        leave.set()
        a.close()
        b.close()
    assert noticed == [True]
    assert steps.count == 2 + 3  # a stopped right after the step its client left in; b ran its 3
    (done,) = b.completed()
    assert done["success"] and done["output"]["data"][INFO].startswith("**Strategy:** `sdpa`")
    assert a.completed() == []  # a's stream was closed: nothing more was sent to it
    err = capfd.readouterr().err
    assert (
        "gradio_demo_npu: a request was stopped because its client left (after step 2 of 50 under strategy "
        "'vanilla')\n" in err
    )
    assert "Traceback" not in err


@pytest.mark.slow
def test_malformed_api_calls_are_refused_in_one_line_without_a_traceback(launch, capfd):
    import gradio as gr
    import httpx
    from gradio_client import Client as GradioClient

    demo, url = launch()
    client = GradioClient(url, verbose=False)
    quiet = "print_exception" in inspect.signature(gr.Error.__init__).parameters

    def assert_refused(arguments, message, endpoint="/generate") -> None:
        """A malformed call gets back ``message``: as a gr.Error (gradio >= 5.9), else as the page's message line."""
        if quiet:
            from gradio_client.exceptions import AppError

            with pytest.raises(AppError) as caught:
                client.predict(*arguments, api_name=endpoint)
            assert str(caught.value) == message
        else:
            result = client.predict(*arguments, api_name=endpoint)
            assert result[INFO if endpoint == "/generate" else 1] == formatting.error_markdown(MalformedCall(message))

    cases = [
        (values(steps="many"), "steps must be a number from 1 to 50, got str 'many'"),
        (values(steps=500), "steps must be a number from 1 to 50, got int 500"),
        (values(prompt=["a", "list"]), "prompt must be text, got list ['a', 'list']"),
        (values(seed={"x": 1}), "seed must be a number (or empty), got dict {'x': 1}"),
        (values(height=True), "height must be a number (or empty), got bool True"),
        (values(guidance_scale=-1), "guidance_scale must be a number from 0 to 30, got int -1"),
        (values(strategy="nope"), "strategy: unknown strategy 'nope'; choose one of: auto, sdpa, vanilla"),
        (  # offered by no picker because it cannot run here: refused with the reason, before it waits or runs
            values(strategy="ascend-910b"),
            "strategy: strategy 'ascend-910b' cannot run here (needs an Ascend NPU: torch_npu is not installed); "
            "choose one of: auto, sdpa, vanilla",
        ),
        (values(strategy=3), "strategy must be a strategy name, one of: auto, sdpa, vanilla; got int 3"),
    ]
    for arguments, message in cases:
        assert_refused(arguments, message)
    assert_refused(
        [*values(), "sdpa"],
        "strategies must be a list of strategy names (from: auto, sdpa, vanilla), got str 'sdpa'",
        endpoint="/compare",
    )
    # the page's own refusal (a value a person can type) is unchanged: the message line, no error
    image, label, download, info, _ = client.predict(*values(height=4096), api_name="/generate")
    assert (
        image is None
        and label == ""
        and download is None
        and info.startswith("✘ **Not run:** height must be a multiple of 2 between 2 and 128")
    )
    # a call of the right shape still works
    image, label, download, info, _ = client.predict(*values(), api_name="/generate")
    assert (
        image
        and download
        and label == "64 × 64 px, shown at 8×"
        and info.startswith("**Strategy:** `sdpa` → resolved **`sdpa`**")
    )

    # what gradio_client cannot send: the wrong number of values, an event that does not exist, a route around the
    # queue — refused at the door, before the request waits
    index = {fn.api_name: key for key, fn in _functions(demo).items()}
    join = url + "gradio_api/queue/join"
    short = httpx.post(join, json={"data": values()[:5], "fn_index": index["generate"], "session_hash": "raw"})
    assert (short.status_code, short.json()) == (
        400,
        {
            "detail": "generate takes 8 values (prompt, negative_prompt, steps, seed, height, width, guidance_scale, "
            "strategy), got 5"
        },
    )
    nowhere = httpx.post(join, json={"data": values(), "fn_index": 99, "session_hash": "raw"})
    assert (nowhere.status_code, nowhere.json()) == (
        400,
        {"detail": "no such endpoint; the demo's endpoints: generate, compare"},
    )
    around = httpx.post(url + "gradio_api/run/generate", json={"data": values()}, timeout=60)
    assert around.status_code == 404  # api_open=False: every call goes through the queue and its limits
    client.close()
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err and "Traceback" not in captured.out
