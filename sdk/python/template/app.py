"""{{name}}: a sluice transform in Python.

Each record's value is read as UTF-8 text (bad bytes replaced by U+FFFD); a
record with no value is rejected (it becomes a dead letter); every other one
gives a row of target `out` with its offset and its value, ASCII letters in
upper case, after the `prefix` param. Every language's template does exactly
this.

Try it:   sluice build && sluice test dist/{{name}}.wasm --input sample.jsonl
"""

import string

from sluice_plugin import Transform, export, log

ASCII_UPPER = str.maketrans(string.ascii_lowercase, string.ascii_uppercase)


class Upper(Transform):
    def __init__(self, params: dict):
        # The pipeline's `[module.params]`, parsed from JSON.
        self.prefix = params.get("prefix", "")

    def process(self, batch, out):
        t = out.target("out", offset="int64", value="text")
        for r in batch:
            if r.value is None:
                out.reject(r, "no value")
                continue
            out.row(t, offset=r.offset, value=self.prefix + r.text().translate(ASCII_UPPER))
        log.info(f"{len(batch)} records")


WitWorld = export(Upper)
