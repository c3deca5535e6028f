"""hgrn_fairseq.evaluation.lm_eval: the lm-evaluation-harness model over a fairseq checkpoint.

A tiny hgrn_lm is trained here with fairseq-train on tests/lm_corpus.py's word corpus (whitespace
tokens, ``--tokenizer space``). Checked against the model's own full forward, computed here:
multiple-choice accuracy through ``lm_eval.simple_evaluate`` on a task defined from local JSONL;
``loglikelihood_rolling`` of a document longer than the training length (state carried across
chunks) equals the sum of the full-forward token log-probs; ``generate_until`` stops at its ``until``
string and equals greedy decoding with ``fairseq-interactive`` (beam 1).
"""
import json
import os
import subprocess
import sys

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval", reason="lm-evaluation-harness is the [eval] extra: pip install -e '.[eval]'")

import hgrn_fairseq  # noqa: E402,F401
from hgrn_fairseq.evaluation import lm_eval as ours  # noqa: E402
from tests.lm_corpus import binarise, write_corpus  # noqa: E402

PLUGIN = os.path.dirname(os.path.abspath(hgrn_fairseq.__file__))
TPS = 32


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("zero_shot")
    write_corpus(str(root / "text"))
    data = binarise(str(root / "text"), str(root / "bin"))
    cmd = [sys.executable, "-m", "fairseq_cli.train", data, "--user-dir", PLUGIN, "--task", "hgrn_language_modeling",
           "--arch", "hgrn_lm_tiny", "--tokens-per-sample", str(TPS), "--sample-break-mode", "none",
           "--batch-size", "8", "--optimizer", "adam", "--lr", "3e-3", "--lr-scheduler", "inverse_sqrt",
           "--warmup-updates", "5", "--max-update", "40", "--save-dir", str(root / "ckpt"), "--no-epoch-checkpoints",
           "--log-format", "simple", "--num-workers", "0", "--cpu", "--seed", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return data, str(root / "ckpt" / "checkpoint_last.pt"), root


@pytest.fixture(scope="module")
def model(trained):
    data, ckpt, _ = trained
    return ours.HgrnFairseqLM(path=ckpt, data=data, batch_size=3, rolling_chunk=7, device="cpu", tokenizer="space")


def full_forward_log_probs(model, ids):
    """log p(ids[t] | eos, ids[:t]) for every t, from one full forward of the whole sequence (float64 sums)."""
    tokens = torch.tensor([[model.eot_token_id] + ids[:-1]])
    with torch.no_grad():
        logits = model.model(tokens)[0][0]
    lp = logits.double().log_softmax(-1)
    return lp.gather(-1, torch.tensor(ids)[:, None])[:, 0]


def write_local_task(root, docs):
    return ours.write_local_multiple_choice_task(str(root / "tasks"), "local_mc", docs)


def test_multiple_choice_accuracy_equals_direct_computation(trained, model, tmp_path):
    gen = torch.Generator().manual_seed(0)
    docs = []
    for i in range(12):
        start = int(torch.randint(0, 100, (1,), generator=gen))
        context = " ".join(f"w{start + k}" for k in range(4))
        right = f" w{start + 4} w{start + 5}"
        wrong = [f" w{int(torch.randint(0, 120, (1,), generator=gen))}" for _ in range(2)]
        choices = [right] + wrong
        docs.append({"context": context, "choices": choices, "label": i % 3})
        docs[-1]["choices"] = choices[i % 3:] + choices[:i % 3]  # the right answer sits at any position
        docs[-1]["label"] = (3 - i % 3) % 3
    include = write_local_task(tmp_path, docs)
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include)
    results = lm_eval.simple_evaluate(model=model, tasks=["local_mc"], task_manager=manager, log_samples=False,
                                      num_fewshot=0)
    got = results["results"]["local_mc"]["acc,none"]

    correct = 0
    for d in docs:
        scores = []
        for choice in d["choices"]:
            ctx = model.tok_encode(d["context"])
            whole = model.tok_encode(d["context"] + choice)
            cont = whole[len(ctx):]  # the harness's split: the continuation is what the context's encoding leaves
            scores.append(float(full_forward_log_probs(model, ctx + cont)[len(ctx):].sum()))
        correct += int(max(range(len(scores)), key=scores.__getitem__) == d["label"])
    assert got == pytest.approx(correct / len(docs), abs=1e-12)
    assert correct > len(docs) / 3  # the trained model is above chance on its own corpus's successor rule


def test_loglikelihood_batching_matches_single_requests(model):
    reqs = [(None, model.tok_encode(c), model.tok_encode(x)) for c, x in
            [("w1 w2", "w3"), ("w5 w6 w7 w8 w9", "w10 w11"), ("w40", "w41 w42 w43"), ("w3", "w90")]]
    batched = model._loglikelihood_tokens(reqs)
    for req, (score, greedy) in zip(reqs, batched):
        ids = req[1] + req[2]
        expected = float(full_forward_log_probs(model, ids)[len(req[1]):].sum())
        assert score == pytest.approx(expected, abs=1e-4)
        assert isinstance(greedy, bool)


def test_rolling_loglikelihood_carries_the_state(model):
    # 5x the training length, read in chunks of 7 tokens with the state carried across them
    ids = [model.dictionary.index(f"w{(3 + k) % 120}") for k in range(5 * TPS)]
    expected = float(full_forward_log_probs(model, ids).sum())
    assert model.rolling_log_likelihood(ids) == pytest.approx(expected, rel=1e-5)

    class Req:
        args = (" ".join(model.dictionary[i] for i in ids),)

    assert model.loglikelihood_rolling([Req()])[0] == pytest.approx(expected, rel=1e-5)


def test_generate_until_equals_fairseq_greedy_decoding(trained, model):
    data, ckpt, _ = trained
    prompt = "w5 w6 w7"
    text = model.generate(prompt, until=["never-said"], max_gen_toks=12)
    ours_tokens = text.split()
    assert len(ours_tokens) == 12
    proc = subprocess.run(
        [sys.executable, "-m", "fairseq_cli.interactive", data, "--user-dir", PLUGIN, "--task",
         "hgrn_language_modeling", "--path", ckpt, "--beam", "1", "--nbest", "1", "--max-len-b", "15",
         "--min-len", "1", "--cpu"], input=prompt + "\n", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    hyp = next(line.split("\t")[2].split() for line in proc.stdout.splitlines() if line.startswith("H-"))
    assert hyp[:3] == prompt.split()
    theirs = hyp[3:]
    n = min(len(theirs), len(ours_tokens))
    assert n >= 8 and ours_tokens[:n] == theirs[:n], (ours_tokens, theirs)

    # stops at (and cuts before) the first until string
    stop = ours_tokens[4]
    cut = model.generate(prompt, until=[stop], max_gen_toks=12)
    assert cut.split() == ours_tokens[:4] and stop not in cut

    class Req:
        args = (prompt, {"until": [stop], "max_gen_toks": 12})

    assert model.generate_until([Req()]) == [cut]


def test_bad_input_is_one_clear_line(trained):
    data, ckpt, root = trained
    with pytest.raises(ours.ZeroShotError, match="has no TOKENIZER_INFO.json .* pass --tokenizer"):
        ours.HgrnFairseqLM(path=ckpt, data=data, device="cpu")
    with pytest.raises(ours.ZeroShotError, match="batch_size=0 is invalid"):
        ours.HgrnFairseqLM(path=ckpt, data=data, device="cpu", tokenizer="space", batch_size=0)
    with pytest.raises(ours.ZeroShotError, match="dtype=bf16 is for CUDA"):
        ours.HgrnFairseqLM(path=ckpt, data=data, device="cpu", tokenizer="space", dtype="bf16")
    # a foreign dictionary (another corpus, other words) from another directory is refused
    write_corpus(str(root / "other_text"), vocab=60, seed=5)
    other = binarise(str(root / "other_text"), str(root / "other_bin"))
    with pytest.raises(ours.ZeroShotError, match="tokenizer mismatch"):
        ours.HgrnFairseqLM(path=ckpt, data=other, device="cpu", tokenizer="space")


def test_command_runs_offline_on_a_local_task_and_names_missing_data(trained, tmp_path):
    data, ckpt, _ = trained
    docs = [{"context": "w1 w2 w3", "choices": [" w4", " w77"], "label": 0},
            {"context": "w50 w51", "choices": [" w9", " w52"], "label": 1}]
    include = write_local_task(tmp_path, docs)
    out = tmp_path / "results.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("HF_DATASETS_OFFLINE", None)
    base = [sys.executable, "-m", "hgrn_fairseq.evaluation.lm_eval", "--path", ckpt, "--data", data,
            "--tokenizer", "space", "--device", "cpu"]
    proc = subprocess.run(base + ["--tasks", "local_mc", "--include-path", include, "--output", str(out)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| local_mc |" in proc.stdout
    saved = json.load(open(out))
    assert "acc,none" in saved["results"]["local_mc"] and saved["model"]["tokenizer_kind"] == "space"

    # a harness task whose data are not cached, offline: the error names the task and what to do
    env["HF_HOME"] = str(tmp_path / "empty_hf_home")
    proc = subprocess.run(base + ["--tasks", "piqa"], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 2
    assert "task piqa: its data could not be loaded" in proc.stderr and "--include-path" in proc.stderr


def test_local_task_writer_refuses_a_bad_label(tmp_path):
    with pytest.raises(ours.ZeroShotError, match="document 0 of task t: needs context, choices and a label"):
        ours.write_local_multiple_choice_task(str(tmp_path), "t", [{"context": "a", "choices": [" b"], "label": 3}])


def test_install_hint_without_the_harness(monkeypatch, capsys):
    monkeypatch.setattr(ours, "_HARNESS_ERROR", ImportError("no lm_eval"))
    assert ours.main(["--path", "x.pt", "--tasks", "piqa"]) == 2
    assert "pip install -e '.[eval]'" in capsys.readouterr().err
