"""`gearshift generate --interactive`: a conversation in the terminal, each reply streamed as it decodes.

With a chat template the whole conversation goes through it every turn, and the engine's request loop
(`Engine.serve`) keeps the conversation's K/V in its slot, so with `--policy ar` each turn prefills
only what is new (`Engine.serve`'s prefix reuse). Without a template, or with --no-chat, each line is
a raw completion of its own. `/reset` forgets the conversation, `/exit` or end of input (Ctrl-D)
leaves, and Ctrl-C stops the reply being written (what was written stays in the conversation) or,
at the prompt, leaves.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Callable, TextIO

from gearshift.errors import GearshiftError

HELP = "commands: /reset forgets the conversation, /exit leaves (or Ctrl-D); Ctrl-C stops a reply"


def run_interactive(engine, policy, sampling: Callable[[], object], chat: bool | None, system: str | None,
                    first: list[str], stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout,
                    stderr: TextIO = sys.stderr) -> int:
    from gearshift.engine.engine import Request

    if engine.tokenizer is None:
        raise GearshiftError(f"{engine.loaded.source} has no tokenizer; --interactive needs text")
    has_template = bool(getattr(engine.tokenizer, "chat_template", None))
    if chat and not has_template:
        raise GearshiftError("this model's tokenizer has no chat template; use --no-chat")
    as_chat = has_template if chat is None else chat
    start = [{"role": "system", "content": system}] if system and as_chat else []
    state = {"history": list(start), "turn": None, "id": 0, "written": [], "busy": False}
    pending = list(first)
    prompt_mark = "> " if stdin.isatty() else ""
    aborted: set[int] = set()
    print(("chat" if as_chat else "raw completion, one line at a time") + f"; {HELP}", file=stderr)

    def next_turn(idle: bool):
        """The engine's pull: nothing while a reply decodes; else the next line, as a request (None: leave)."""
        if not idle:
            return []
        while True:
            if pending:
                line = pending.pop(0)
            else:
                stdout.write(prompt_mark)
                stdout.flush()
                try:
                    line = stdin.readline()
                except KeyboardInterrupt:
                    line = ""
                if not line:  # end of input
                    if prompt_mark:
                        stdout.write("\n")
                    return None
                line = line.rstrip("\n")
            cmd = line.strip()
            if not cmd:
                continue
            if cmd in ("/exit", "/quit"):
                return None
            if cmd == "/reset":
                state["history"] = list(start)
                print("(conversation forgotten)", file=stderr)
                continue
            turn = state["history"] + [{"role": "user", "content": line}]
            ids = engine.encode_chat(turn) if as_chat else engine.encode_prompt(line, chat=False)
            params = sampling()
            room = engine.max_seq_len - len(ids)
            if room < 1:
                print(f"gearshift: the conversation has {len(ids)} tokens and the context holds "
                      f"{engine.max_seq_len}: /reset to start again", file=stderr)
                continue
            params.max_new_tokens = min(params.max_new_tokens, room)
            state.update(turn=turn, id=state["id"] + 1, written=[], busy=True)
            return [(state["id"], Request(ids, params))]

    def on_sigint(signum, frame):
        if state["busy"]:
            aborted.add(state["id"])  # the engine ends the reply at its next step
        else:
            raise KeyboardInterrupt

    handler = None
    if threading.current_thread() is threading.main_thread():
        handler = signal.signal(signal.SIGINT, on_sigint)
    try:
        for ev in engine.serve(next_turn, policy, aborted):
            state["written"].append(ev.text)
            stdout.write(ev.text)
            if ev.finished:
                state["busy"] = False
                reply = ev.full_text if ev.finish_reason != "abort" else "".join(state["written"])
                stdout.write(" [stopped]\n" if ev.finish_reason == "abort" else "\n")
                if as_chat:
                    state["history"] = state["turn"] + [{"role": "assistant", "content": reply or ""}]
            stdout.flush()
    finally:
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
    return 0
