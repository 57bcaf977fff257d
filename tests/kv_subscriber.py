#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""A KV-cache event subscriber as a fleet router runs one, for tests/test_daemon_kv_events.c.

usage: kv_subscriber.py PUB_ENDPOINT REPLAY_ENDPOINT|- STATE_FILE

Decodes every batch as vLLM's kv_events.py defines it: [ts, [event, ...], data_parallel_rank]
with events as vLLM 0.11's msgspec array_like tagged structs (BlockStored [tag, hashes,
parent, token_ids, block_size, lora_id, medium], BlockRemoved [tag, hashes, medium],
AllBlocksCleared [tag]) or as current vLLM's tagged maps ({"type": tag, field: value}),
keeps the set of block hashes it believes each medium holds, and rewrites STATE_FILE (JSON)
after every batch. With a replay endpoint it joins late as vLLM's subscriber does: it
subscribes first, asks the ROUTER for every batch from sequence 0, applies the replay up to
the end marker (-1), then the live batches it held that came after the replay.
"""
import json
import os
import sys

import msgpack
import zmq

MEDIA = ("GPU", "CPU", "DISK")


class State:
    def __init__(self):
        self.sets = {m: set() for m in MEDIA}
        self.batches = 0
        self.cleared = 0
        self.stored = 0
        self.stored_events = 0  # BlockStored events: one may carry a chain of blocks
        self.forms = set()  # "array", "map": the encodings seen
        self.removed = 0
        self.last_seq = -1
        self.gaps = 0
        self.replayed = 0
        self.bad = []

    # current vLLM's events are maps of named fields ({"type": "BlockStored", ...}); vLLM
    # 0.11's are positional arrays: both to the positional form
    FIELDS = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size",
                              "lora_id", "medium"),
              "BlockRemoved": ("block_hashes", "medium"),
              "AllBlocksCleared": ()}

    def positional(self, ev):
        if isinstance(ev, list):
            self.forms.add("array")
            return ev
        if isinstance(ev, dict) and ev.get("type") in self.FIELDS:
            self.forms.add("map")
            names = self.FIELDS[ev["type"]]
            if any(n not in ev for n in names):
                return None
            return [ev["type"]] + [ev[n] for n in names]
        return None

    def apply(self, seq, payload):
        if seq <= self.last_seq:
            return  # already applied (a replayed batch also seen live)
        if self.last_seq >= 0 and seq != self.last_seq + 1:
            self.gaps += 1
        self.last_seq = seq
        batch = msgpack.unpackb(payload, raw=False)
        if not (isinstance(batch, list) and len(batch) == 3 and isinstance(batch[0], float)
                and isinstance(batch[1], list) and batch[2] == 0):
            self.bad.append("batch %d: %r" % (seq, batch)[:200])
            return
        self.batches += 1
        for ev in batch[1]:
            ev = self.positional(ev)
            tag = ev[0] if isinstance(ev, list) and ev else None
            if tag == "BlockStored" and len(ev) == 7:
                _, hashes, parent, tokens, block_size, lora_id, medium = ev
                if (medium not in MEDIA or lora_id is not None or not hashes
                        or len(tokens) != block_size * len(hashes)
                        or not all(isinstance(h, int) for h in hashes)
                        or not (parent is None or isinstance(parent, int))):
                    self.bad.append("BlockStored %r" % (ev,))
                    continue
                self.sets[medium].update(hashes)
                self.stored += len(hashes)
                self.stored_events += 1
            elif tag == "BlockRemoved" and len(ev) == 3:
                _, hashes, medium = ev
                if medium not in MEDIA:
                    self.bad.append("BlockRemoved %r" % (ev,))
                    continue
                for h in hashes:
                    self.sets[medium].discard(h)
                self.removed += len(hashes)
            elif tag == "AllBlocksCleared" and len(ev) == 1:
                for m in MEDIA:
                    self.sets[m].clear()
                self.cleared += 1
            else:
                self.bad.append("unknown event %r" % (ev,)[:200])

    def write(self, path):
        # hashes as decimal strings: they are 64-bit unsigned, past what JSON readers keep
        out = {m: [str(h) for h in sorted(self.sets[m])] for m in MEDIA}
        out.update(batches=self.batches, cleared=self.cleared, stored=self.stored,
                   stored_events=self.stored_events, forms=sorted(self.forms),
                   removed=self.removed, last_seq=self.last_seq, gaps=self.gaps,
                   replayed=self.replayed, bad=self.bad[:5])
        with open(path + ".tmp", "w") as f:
            json.dump(out, f)
        os.rename(path + ".tmp", path)


def main():
    pub, replay, path = sys.argv[1], sys.argv[2], sys.argv[3]
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub)
    st = State()
    if replay != "-":
        held = []
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(replay)
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        while True:
            while sub.poll(0):
                held.append(sub.recv_multipart())
            if not dealer.poll(10000):
                st.bad.append("no answer from the replay socket")
                break
            _, seq_b, payload = dealer.recv_multipart()
            seq = int.from_bytes(seq_b, "big", signed=True)
            if seq == -1:
                break
            st.apply(seq, payload)
            st.replayed += 1
        for _, seq_b, payload in held:
            st.apply(int.from_bytes(seq_b, "big"), payload)
    st.write(path)
    while True:
        if sub.poll(100):
            _, seq_b, payload = sub.recv_multipart()
            st.apply(int.from_bytes(seq_b, "big"), payload)
            while sub.poll(0):
                _, seq_b, payload = sub.recv_multipart()
                st.apply(int.from_bytes(seq_b, "big"), payload)
            st.write(path)


if __name__ == "__main__":
    main()
