"""The conformance transform in Python (docs/languages.md states it; every
language's copy must give byte-identical output on the same input)."""

from sluice_plugin import Transform, export


def ascii_words(text: str):
    word = []
    for ch in text:
        if ch.isascii() and ch.isalnum():
            word.append(ch.lower())
        elif word:
            yield "".join(word)
            word = []
    if word:
        yield "".join(word)


class Conformance(Transform):
    def process(self, batch, out):
        events = out.target(
            "events", offset="int64", user="text", score="float64",
            scaled="float64", key="bytes", words="int64", vip="bool",
        )
        words = out.target("words", offset="int64", word="text")
        now = batch.context.batch_time_ms
        for r in batch:
            try:
                obj = r.json()
            except ValueError:
                obj = None
            if not isinstance(obj, dict):
                out.reject(r, "not a JSON object")
                continue
            if obj.get("keep") is False:
                continue
            user = obj.get("user")
            score = obj.get("score")
            if isinstance(score, bool) or not isinstance(score, (int, float)):
                score = None
            text = obj.get("text")
            split = list(ascii_words(text)) if isinstance(text, str) else []
            out.row(
                events,
                offset=r.offset,
                user=user if isinstance(user, str) else None,
                score=score,
                scaled=None if score is None else float(score) * 0.1,
                key=r.key,
                words=len(split),
                vip=obj.get("vip") is True,
            )
            for w in split:
                out.row(words, r.offset, w)
            if not isinstance(user, str):
                continue
            state = r.state()
            n = (state.get_int("n:" + user) or 0) + 1
            last = state.get_str("last:" + user)
            if obj.get("forget") is True:
                state.delete("n:" + user)
            else:
                state.set_int("n:" + user, n)
            expires = now if obj.get("expire") is True else now + 60_000
            value = text if isinstance(text, str) else ""
            state.set_expiring("last:" + user, value.encode("utf-8"), expires)
            # Declared where its first row is made: mid-batch, after rows of
            # the other targets (later calls find it by name).
            seen = out.target("seen", offset="int64", user="text", n="int64", last="text")
            out.row(seen, r.offset, user, n, last)


WitWorld = export(Conformance)
