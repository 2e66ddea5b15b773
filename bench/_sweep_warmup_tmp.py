"""Temporary: sweep warm-up recipes on the GPU box (accuracy vs steps). Deleted after use."""

import collections
import json
import math
import os
import sys
import tempfile
import time
from multiprocessing import get_context

import torch

sys.path.insert(0, os.getcwd())

from exgrpo.models import TinyModelSpec, build_char_tokenizer, build_tiny_model  # noqa: E402
from exgrpo.tasks import ArithTask  # noqa: E402
from exgrpo.templates import render_prompt  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def encode_all(prompts, tok, task):
    rows = []
    for p in prompts:
        a = tok.encode(render_prompt(p.question, template="plain"), add_special_tokens=False)
        b = tok.encode(task.solution_text(p), add_special_tokens=False) + [tok.eos_token_id]
        rows.append((a, b))
    width = max(len(a) + len(b) for a, b in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    lab = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (a, b) in enumerate(rows):
        ids[i, : len(a) + len(b)] = torch.tensor(a + b)
        lab[i, len(a) : len(a) + len(b)] = torch.tensor(b)
    return ids, lab


@torch.no_grad()
def evaluate(model, tok, task, ev, k=8):
    prompts = [render_prompt(p.question, template="plain") for p in ev]
    enc = [tok.encode(t, add_special_tokens=False) for t in prompts]
    width = max(map(len, enc))
    ids = torch.zeros(len(enc), width, dtype=torch.long)
    att = torch.zeros_like(ids)
    for i, e in enumerate(enc):
        ids[i, width - len(e) :] = torch.tensor(e)
        att[i, width - len(e) :] = 1
    ids, att = ids.to(DEV), att.to(DEV)
    gold = [task.solution_text(p) for p in ev]
    res = {}
    g = model.generate(input_ids=ids, attention_mask=att, do_sample=False, max_new_tokens=16, pad_token_id=0, eos_token_id=1)
    gt = tok.batch_decode(g[:, width:], skip_special_tokens=True)
    res["greedy"] = sum(a.strip() == b for a, b in zip(gt, gold)) / len(ev)
    s = model.generate(
        input_ids=ids.repeat_interleave(k, 0),
        attention_mask=att.repeat_interleave(k, 0),
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=16,
        pad_token_id=0,
        eos_token_id=1,
    )
    st = tok.batch_decode(s[:, width:], skip_special_tokens=True)
    ok = [a.strip() == gold[i // k] for i, a in enumerate(st)]
    per_q = [sum(ok[i * k : (i + 1) * k]) for i in range(len(ev))]
    res["t1"] = sum(ok) / len(ok)
    res["khist"] = [per_q.count(j) for j in range(k + 1)]
    byd = collections.defaultdict(list)
    for p, c in zip(ev, per_q):
        byd[min(task.difficulty(p), 6)].append(c / k)
    res["bydiff"] = {d: round(sum(v) / len(v), 2) for d, v in sorted(byd.items())}
    return res


def run(cfg):
    torch.set_num_threads(1)
    torch.manual_seed(cfg.get("seed", 0))
    h, L, ff = cfg["arch"]
    spec = TinyModelSpec(
        hidden_size=h,
        num_layers=L,
        num_heads=max(1, h // cfg.get("hd", 32)),
        num_kv_heads=max(1, h // (2 * cfg.get("hd", 32))),
        head_dim=cfg.get("hd", 32),
        intermediate_size=ff,
        max_position=64,
        init_std=cfg.get("init", 0.02),
    )
    tok = build_char_tokenizer()
    task = ArithTask()
    with tempfile.TemporaryDirectory() as d:
        build_tiny_model(d, spec=spec)
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).to(DEV)
    train = task.make_split(split="train", n=cfg.get("ntrain", 50000), seed=0)
    ev = task.make_split(split="eval", n=200, seed=0)
    ids, lab = encode_all(train, tok, task)
    ids, lab = ids.to(DEV), lab.to(DEV)
    if cfg.get("weight") == "easy":
        w = torch.tensor([1.0 / (1 + task.difficulty(p)) ** 1.5 for p in train], device=DEV)
    else:
        w = torch.ones(len(train), device=DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.01, betas=(0.9, cfg.get("b2", 0.999)))
    gen = torch.Generator(device=DEV).manual_seed(0)
    steps, bs, warm = max(cfg["ckpts"]), cfg["bs"], 50
    out, t0 = [], time.time()
    losses = []
    for step in range(1, steps + 1):
        lr = cfg["lr"] * min(1.0, step / warm)
        if cfg.get("sched") == "cos":
            lr *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps))
        for gr in opt.param_groups:
            gr["lr"] = lr
        idx = torch.multinomial(w, bs, replacement=True, generator=gen)
        model.train()
        loss = model(input_ids=ids[idx], labels=lab[idx]).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step in cfg["ckpts"]:
            model.eval()
            r = evaluate(model, tok, task, ev)
            r.update(step=step, loss=round(sum(losses[-50:]) / 50, 4), name=cfg["name"], secs=round(time.time() - t0, 1))
            out.append(r)
            print(json.dumps(r), flush=True)
    return out


def main():
    base = dict(arch=(128, 2, 256), lr=3e-3, bs=64, ckpts=[300, 600, 1000, 1500, 2500, 4000])
    cfgs = []

    def add(name, **kw):
        c = dict(base)
        c.update(kw)
        c["name"] = name
        cfgs.append(c)

    for arch in [(64, 2, 256), (128, 2, 256), (128, 2, 512), (128, 3, 256), (128, 4, 256), (192, 2, 384), (256, 2, 512)]:
        for lr in [1e-3, 3e-3]:
            add(f"a{arch}-lr{lr}", arch=arch, lr=lr)
    add("bs32", bs=32)
    add("bs128", bs=128)
    add("bs128-lr1e-3", bs=128, lr=1e-3)
    add("easy", weight="easy")
    add("easy-L3", weight="easy", arch=(128, 3, 256))
    add("b2-.98", b2=0.98)
    add("hd64", arch=(128, 2, 256), hd=64)
    add("init.1", init=0.1)
    add("ntrain5k", ntrain=5000)
    add("cos600", sched="cos", ckpts=[600])
    add("cos1000", sched="cos", ckpts=[1000])
    add("cos1000-L3", sched="cos", ckpts=[1000], arch=(128, 3, 256))
    add("cos1000-lr1e-2", sched="cos", ckpts=[1000], lr=1e-2)
    add("lr1e-2", lr=1e-2)
    add("L3-lr1e-2", lr=1e-2, arch=(128, 3, 256))
    add("h64L4", arch=(64, 4, 256))
    add("h64L4-lr1e-2", arch=(64, 4, 256), lr=1e-2)
    if os.environ.get("SMOKE"):
        cfgs = [dict(c, ckpts=[10]) for c in cfgs[:2]]
    if os.environ.get("ONLY"):
        cfgs = [dict(c, ckpts=[250, 500, 1000]) for c in cfgs if c["name"] in os.environ["ONLY"].split(",")]
    with get_context("spawn").Pool(int(sys.argv[1]) if len(sys.argv) > 1 else 16) as pool:
        results = pool.map(run, cfgs, chunksize=1)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "sweep.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
