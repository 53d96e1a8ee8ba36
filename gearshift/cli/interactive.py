"""`gearshift generate --interactive`: a conversation in the terminal, each reply streamed as it decodes.

With a chat template the whole conversation goes through it every turn (there is no prefix cache, so
each turn prefills the history again); without one, or with --no-chat, each line is a raw completion
of its own. `/reset` forgets the conversation, `/exit` or end of input (Ctrl-D) leaves, and Ctrl-C
stops the reply being written (what was written stays in the conversation).
"""

from __future__ import annotations

import sys
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
    history: list[dict] = [{"role": "system", "content": system}] if system and as_chat else []
    print(("chat" if as_chat else "raw completion, one line at a time") + f"; {HELP}", file=stderr)
    pending = list(first)
    prompt_mark = "> " if stdin.isatty() else ""
    while True:
        if pending:
            line = pending.pop(0)
        else:
            stdout.write(prompt_mark)
            stdout.flush()
            line = stdin.readline()
            if not line:  # end of input
                if prompt_mark:
                    stdout.write("\n")
                return 0
            line = line.rstrip("\n")
        if not line.strip():
            continue
        if line.strip() in ("/exit", "/quit"):
            return 0
        if line.strip() == "/reset":
            history = history[:1] if history and history[0]["role"] == "system" else []
            print("(conversation forgotten)", file=stderr)
            continue
        turn = history + [{"role": "user", "content": line}]
        ids = engine.encode_chat(turn) if as_chat else engine.encode_prompt(line, chat=False)
        params = sampling()
        if len(ids) + 1 >= engine.max_seq_len:
            print(f"gearshift: the conversation has {len(ids)} tokens and the context holds {engine.max_seq_len}: "
                  "/reset to start again", file=stderr)
            continue
        written: list[str] = []

        def show(ev):
            written.append(ev.text)
            stdout.write(ev.text)
            stdout.flush()

        try:
            (result,) = engine.generate([Request(ids, params)], policy, on_event=show)
            reply = result.text or ""
        except KeyboardInterrupt:
            reply = "".join(written)
            stdout.write(" [stopped]")
        stdout.write("\n")
        stdout.flush()
        if as_chat:
            history = turn + [{"role": "assistant", "content": reply}]
