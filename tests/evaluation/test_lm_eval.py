"""hgrn_fairseq.evaluation.lm_eval: the lm-evaluation-harness model over a fairseq checkpoint.

Two tiny models are trained here by fairseq's own preprocess / train entry points, run in this
process (no interpreter start-up per command): an ``hgrn_lm_tiny`` (40 updates) and a one-layer
``transformer_lm`` with 16 positions (40 updates), on tests/lm_corpus.py's word corpus (whitespace
tokens, ``--tokenizer space``). Every expected value is computed here from one plain full forward of
the model per sequence (float64 sums), independently of the code under test:

* a multiple-choice task from local JSONL through ``lm_eval.simple_evaluate`` gives exactly the
  accuracy from those log-probabilities;
* batched ``loglikelihood`` equals single forwards (with left truncation at the position limit);
* ``loglikelihood_rolling`` of a document 5x the training length: the recurrent model (state carried
  across 7-token chunks) equals the full-forward sum; the Transformer equals the harness's disjoint
  windows, written out here as a loop;
* ``generate_until`` equals fairseq's own greedy search (``SequenceGenerator``, beam 1, what
  ``fairseq-generate`` / ``fairseq-interactive`` run) and stops before its ``until`` string;
* the command (``python -m hgrn_fairseq.evaluation.lm_eval``) runs offline on a local task;
  uncached data, foreign dictionaries and tokenizer files, and a missing harness give one-line errors.
"""
import json
import re
import os
import sys
from argparse import Namespace

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval", reason="lm-evaluation-harness is the [eval] extra: pip install -e '.[eval]'")

import hgrn_fairseq  # noqa: E402
hgrn_fairseq.register()  # the plugin's models, tasks and criterions, as --user-dir does
from hgrn_fairseq.evaluation import lm_eval as ours  # noqa: E402
from tests.fixtures_corpus import subprocess_env, write_byte_level_gpt2_files  # noqa: E402
from tests.lm_corpus import write_corpus  # noqa: E402
from tests import pyrun

PLUGIN = os.path.dirname(os.path.abspath(hgrn_fairseq.__file__))
TPS = 32  # hgrn_lm's training length
POSITIONS = 16  # the Transformer's position limit


def fairseq_preprocess(text_dir, dest):
    from fairseq import options
    from fairseq_cli import preprocess

    args = options.get_preprocessing_parser().parse_args(
        ["--only-source", "--trainpref", os.path.join(text_dir, "train.txt"), "--validpref",
         os.path.join(text_dir, "valid.txt"), "--destdir", dest, "--workers", "1"])
    preprocess.main(args)
    return dest


def fairseq_train(data, save_dir, argv):
    from fairseq import distributed_utils, options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import train

    args = options.parse_args_and_arch(options.get_training_parser(), [
        data, "--user-dir", PLUGIN, "--task", "hgrn_language_modeling", "--sample-break-mode", "none",
        "--batch-size", "8", "--optimizer", "adam", "--lr", "3e-3", "--save-dir", save_dir,
        "--no-epoch-checkpoints", "--disable-validation", "--log-format", "none", "--num-workers", "0",
        "--cpu", *argv])
    distributed_utils.call_main(convert_namespace_to_omegaconf(args), train.main)
    return os.path.join(save_dir, "checkpoint_last.pt")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: one intra-op thread (several threads only contend on a shared, busy CPU)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_thread):
    root = tmp_path_factory.mktemp("zero_shot")
    write_corpus(str(root / "text"), sizes={"train": 600, "valid": 20})
    data = fairseq_preprocess(str(root / "text"), str(root / "bin"))
    hgrn = fairseq_train(data, str(root / "hgrn"), [
        "--arch", "hgrn_lm_tiny", "--tokens-per-sample", str(TPS), "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", "5", "--max-update", "40", "--seed", "3"])
    transformer = fairseq_train(data, str(root / "transformer"), [
        "--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "32",
        "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "2", "--tokens-per-sample",
        str(POSITIONS), "--max-update", "40", "--seed", "4"])
    return data, {"hgrn": hgrn, "transformer": transformer}, root


@pytest.fixture(scope="module")
def models(trained):
    data, ckpts, _ = trained
    return {name: ours.HgrnFairseqLM(path=path, data=data, batch_size=3, rolling_chunk=7, device="cpu",
                                     tokenizer="space") for name, path in ckpts.items()}


def full_forward_log_probs(model, inputs, targets):
    """log p(targets[t] | inputs[:t+1]) for every t, from one full forward of ``inputs`` (float64)."""
    with torch.no_grad():
        logits = model.model(torch.tensor([inputs]))[0][0]
    lp = logits.double().log_softmax(-1)
    return lp.gather(-1, torch.tensor(targets)[:, None])[:, 0]


def scored(model, ids):
    """log p(ids[t] | end of sentence, ids[:t]) for every t."""
    return full_forward_log_probs(model, [model.eot_token_id] + ids[:-1], ids)


def words(model, first, n):
    return [model.dictionary.index(f"w{(first + k) % 120}") for k in range(n)]


def test_multiple_choice_accuracy_equals_direct_computation(models, tmp_path):
    model = models["hgrn"]
    gen = torch.Generator().manual_seed(0)
    docs = []
    for i in range(12):
        start = int(torch.randint(0, 100, (1,), generator=gen))
        context = " ".join(f"w{start + k}" for k in range(4))
        choices = [f" w{start + 4} w{start + 5}"] + [f" w{int(torch.randint(0, 120, (1,), generator=gen))}"
                                                      for _ in range(2)]
        shift = i % 3  # the right answer sits at every position
        docs.append({"context": context, "choices": choices[shift:] + choices[:shift], "label": (3 - shift) % 3})
    include = ours.write_local_multiple_choice_task(str(tmp_path / "tasks"), "local_mc", docs)
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include, include_defaults=False)
    results = lm_eval.simple_evaluate(model=model, tasks=["local_mc"], task_manager=manager, log_samples=False,
                                      num_fewshot=0)
    got = results["results"]["local_mc"]["acc,none"]

    correct = 0
    for d in docs:
        scores = []
        for choice in d["choices"]:
            ctx = model.tok_encode(d["context"])
            cont = model.tok_encode(choice)  # whitespace tokens: no merge across the boundary
            scores.append(float(scored(model, ctx + cont)[len(ctx):].sum()))
        correct += int(max(range(len(scores)), key=scores.__getitem__) == d["label"])
    assert got == pytest.approx(correct / len(docs), abs=1e-12)
    assert correct > len(docs) / 3  # the trained model is above chance on its own corpus's successor rule


@pytest.mark.parametrize("name", ["hgrn", "transformer"])
def test_loglikelihood_batching_matches_single_forwards(models, name):
    model = models[name]
    pairs = [(words(model, 1, 2), words(model, 3, 1)), (words(model, 5, 5), words(model, 10, 2)),
             (words(model, 40, 1), words(model, 41, 3)), (words(model, 3, 1), words(model, 90, 1)),
             (words(model, 7, 20), words(model, 27, 3))]  # 1 + 20 + 3 tokens: past the Transformer's 16
    got = model._loglikelihood_tokens([(None, c, x) for c, x in pairs])
    for (ctx, cont), (score, greedy) in zip(pairs, got):
        full = [model.eot_token_id] + ctx + cont
        if name == "transformer":
            full = full[-(POSITIONS + 1):]  # the last positions the model can read
        expected = full_forward_log_probs(model, full[:-1], full[1:])[-len(cont):]
        assert score == pytest.approx(float(expected.sum()), abs=1e-4)
        assert isinstance(greedy, bool)


def test_rolling_loglikelihood_carries_the_state(models):
    model = models["hgrn"]
    assert model.recurrent and model.max_length is None
    ids = words(model, 3, 5 * TPS)  # 5x the training length, read in chunks of 7 tokens
    expected = float(scored(model, ids).sum())
    assert model.rolling_log_likelihood(ids) == pytest.approx(expected, rel=1e-5)

    class Req:
        args = (" ".join(model.dictionary[i] for i in ids),)

    assert model.loglikelihood_rolling([Req()])[0] == pytest.approx(expected, rel=1e-5)


def test_rolling_loglikelihood_of_a_transformer_uses_disjoint_windows(models):
    model = models["transformer"]
    assert not model.recurrent and model.max_length == POSITIONS
    ids = words(model, 11, 5 * POSITIONS + 7)
    ext = [model.eot_token_id] + ids
    expected = 0.0
    for start in range(0, len(ids), POSITIONS):  # blocks of L new tokens; the last reads back L positions
        end = min(start + POSITIONS, len(ids))
        lo = max(0, end - POSITIONS)
        lp = full_forward_log_probs(model, ext[lo:end], ids[lo:end])
        expected += float(lp[start - lo:].sum())
    assert model.rolling_log_likelihood(ids) == pytest.approx(expected, rel=1e-5)
    short = ids[:POSITIONS - 3]  # within the limit: one window, the plain full forward
    assert model.rolling_log_likelihood(short) == pytest.approx(float(scored(model, short).sum()), rel=1e-5)


@pytest.mark.parametrize("name", ["hgrn", "transformer"])
def test_generate_until_equals_fairseq_greedy_search(models, name):
    model = models[name]
    prompt, new = "w5 w6 w7", 12
    text = model.generate(prompt, until=["never-said"], max_gen_toks=new)
    ours_ids = model.tok_encode(text)  # whitespace tokens and line breaks map back exactly
    assert len(ours_ids) == new

    task = model.loaded.task
    generator = task.build_generator([model.model], Namespace(beam=1, max_len_a=0, max_len_b=3 + new, min_len=1))
    src = torch.tensor([[model.eot_token_id] + model.tok_encode(prompt)])
    hypo = task.inference_step(generator, [model.model], {"net_input": {"src_tokens": src,
                                                                        "src_lengths": torch.tensor([4])}})
    theirs = hypo[0][0]["tokens"].tolist()[3:]
    if theirs and theirs[-1] == model.eot_token_id:
        theirs = theirs[:-1]  # fairseq ends every hypothesis with end of sentence
    assert theirs == ours_ids[:len(theirs)], (ours_ids, theirs)
    assert len(theirs) == new or ours_ids[len(theirs)] == model.eot_token_id

    # stops at (and cuts before) the first until string
    stop = next(model.dictionary[i] for i in ours_ids[3:] if i != model.eot_token_id)
    cut = model.generate(prompt, until=[stop], max_gen_toks=new)
    assert cut == text[:text.index(stop)]

    class Req:
        args = (prompt, {"until": [stop], "max_gen_toks": new})

    assert model.generate_until([Req()]) == [cut]


def test_encode_pair_is_exact_where_the_tokenizer_merges_across_the_boundary(tmp_path):
    from fairseq.data import Dictionary

    files = write_byte_level_gpt2_files(str(tmp_path / "gpt2"))
    tokenizer = ours.DictionaryTokenizer(Dictionary.load(files["dict.txt"]), "gpt2-bpe", gpt2_dir=str(tmp_path / "gpt2"))
    model = ours.HgrnFairseqLM.__new__(ours.HgrnFairseqLM)  # only the tokenizer is needed
    model.tokenizer_, model.boundary_merges = tokenizer, 0
    d = tokenizer.dictionary
    the, e, x = (d.index(s) for s in ("257", "101", "120"))
    assert tokenizer.encode("the") == [the] and tokenizer.encode("th") == [d.index("256")]
    # "th" + "e" is one token "the": the harness's split would leave nothing to score
    assert model._encode_pair("th", "e") == ([], [the]) and model.boundary_merges == 1
    # no merge: the plain split; a trailing space of the context moves to the continuation
    assert model._encode_pair("x", "the") == ([x], [the]) and model.boundary_merges == 1
    assert model._encode_pair("xe ", "x") == ([x, e], [d.index("32"), x])


def test_gpt2_files_are_checked_against_the_data_marker(tmp_path):
    from fairseq.data import Dictionary

    files = write_byte_level_gpt2_files(str(tmp_path / "gpt2"))
    data = tmp_path / "data"
    data.mkdir()
    marker = {"tokenizer": "gpt2-bpe", "gpt2_sha256": {"encoder.json": ours._sha256(files["encoder.json"]),
                                                       "vocab.bpe": "0" * 64}}
    (data / "TOKENIZER_INFO.json").write_text(json.dumps(marker))
    dictionary = Dictionary.load(files["dict.txt"])
    with pytest.raises(ours.ZeroShotError, match="vocab.bpe is not the file .* was encoded with"):
        ours.resolve_tokenizer(str(data), dictionary, None, None, str(tmp_path / "gpt2"))
    marker["gpt2_sha256"]["vocab.bpe"] = ours._sha256(files["vocab.bpe"])
    (data / "TOKENIZER_INFO.json").write_text(json.dumps(marker))
    assert ours.resolve_tokenizer(str(data), dictionary, None, None, str(tmp_path / "gpt2")).kind == "gpt2-bpe"
    with pytest.raises(ours.ZeroShotError, match="contradicts .* drop --tokenizer"):
        ours.resolve_tokenizer(str(data), dictionary, "space", None, None)


def test_unknown_words_are_counted(models):
    tokenizer = models["hgrn"].tokenizer_
    before = (tokenizer.encoded_symbols, tokenizer.unknown_symbols)
    ids = tokenizer.encode("w1 never-seen w2\nw3 nor-this")
    assert ids.count(tokenizer.dictionary.unk()) == 2 and ids.count(tokenizer.dictionary.eos()) == 1
    assert (tokenizer.encoded_symbols - before[0], tokenizer.unknown_symbols - before[1]) == (5, 2)


def test_bad_input_is_one_clear_line(trained, tmp_path):
    data, ckpts, _ = trained
    ckpt = ckpts["hgrn"]
    with pytest.raises(ours.ZeroShotError, match="has no TOKENIZER_INFO.json .* pass --tokenizer"):
        ours.HgrnFairseqLM(path=ckpt, data=data, device="cpu")
    with pytest.raises(ours.ZeroShotError, match="batch_size=0 is invalid"):
        ours.HgrnFairseqLM(path=ckpt, data=data, device="cpu", tokenizer="space", batch_size=0)
    with pytest.raises(ours.ZeroShotError, match="batch_size=auto is invalid: .*'auto' is not supported"):
        ours.HgrnFairseqLM(path=ckpt, data=data, device="cpu", tokenizer="space", batch_size="auto")
    with pytest.raises(ours.ZeroShotError, match="dtype=bf16 is for CUDA"):
        ours.HgrnFairseqLM(path=ckpt, data=data, device="cpu", tokenizer="space", dtype="bf16")
    symbols = open(os.path.join(data, "dict.txt")).read().splitlines()
    # a dictionary of another size, and one of the same size with other words, in other directories
    for name, lines, message in [("smaller", symbols[:-1], "embedding has .* rows"),
                                 ("other_words", [f"v{i} 1" for i in range(len(symbols))],
                                  r"same size \(\d+ entries\), different symbols: first at id 4 \(dict.txt line 1\)")]:
        other = tmp_path / name
        other.mkdir()
        (other / "dict.txt").write_text("\n".join(lines) + "\n")
        with pytest.raises(ours.ZeroShotError, match="tokenizer mismatch.*" + message):
            ours.HgrnFairseqLM(path=ckpt, data=str(other), device="cpu", tokenizer="space")


@pytest.mark.integration
def test_command_runs_offline_on_a_local_task(trained, tmp_path):
    data, ckpts, _ = trained
    docs = [{"context": "w1 w2 w3", "choices": [" w4", " w77"], "label": 0},
            {"context": "w50 w51", "choices": [" w9", " w52"], "label": 1}]
    include = ours.write_local_multiple_choice_task(str(tmp_path / "tasks"), "local_mc", docs)
    out = tmp_path / "results.json"
    env = subprocess_env()
    env.pop("HF_DATASETS_OFFLINE", None)
    env.pop("HF_HUB_OFFLINE", None)
    proc = pyrun.run([sys.executable, "-m", "hgrn_fairseq.evaluation.lm_eval", "--path", ckpts["hgrn"],
                      "--data", data, "--tokenizer", "space", "--device", "cpu", "--tasks", "local_mc",
                      "--include-path", include, "--output", str(out)],
                     capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| model | local_mc | AVG |" in proc.stdout and "| this checkpoint: acc |" in proc.stdout
    assert "0 not in the dictionary" in proc.stdout
    saved = json.load(open(out))
    acc = saved["results"]["local_mc"]["acc,none"]
    assert acc in (0.0, 0.5, 1.0) and f"| this checkpoint: acc | {100 * acc:.2f} | {100 * acc:.2f} |" in proc.stdout
    assert saved["model"]["tokenizer_kind"] == "space" and saved["tokens"]["unknown_symbols"] == 0


def test_uncached_task_offline_names_the_task_and_the_fix(trained, tmp_path, monkeypatch, capsys):
    data, ckpts, _ = trained
    folder = tmp_path / "tasks"
    folder.mkdir()
    # a task on a Hugging Face dataset that is in no cache (as piqa is on a fresh offline machine)
    (folder / "not_cached.yaml").write_text(
        "task: not_cached\ndataset_path: hgrn-fairseq-tests/never-downloaded\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: '{{q}}'\ndoc_to_choice: '{{c}}'\ndoc_to_target: 0\n"
        "metric_list:\n  - metric: acc\n")
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    for module, attrs in (("datasets.config", ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")),
                          ("huggingface_hub.constants", ("HF_HUB_OFFLINE",))):
        mod = __import__(module, fromlist=["_"])
        for attr in attrs:  # restored after the test: the command switches them for its process
            monkeypatch.setattr(mod, attr, getattr(mod, attr))
    code = ours.main(["--path", ckpts["hgrn"], "--data", data, "--tokenizer", "space", "--device", "cpu",
                      "--tasks", "not_cached", "--include-path", str(folder)])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, errors
    err = errors[0]
    assert "task not_cached: its data could not be loaded" in err and "offline" in err
    assert "--include-path" in err and "$HF_HOME" in err
    assert os.environ["HF_DATASETS_OFFLINE"] == "1"


def test_results_table_has_the_papers_layout():
    results = {"results": {"piqa": {"acc,none": 0.5, "acc_norm,none": 0.625},
                           "winogrande": {"acc,none": 0.25}}}
    table = ours.results_table(results, ["piqa", "winogrande"]).splitlines()
    assert table[0] == "| model | PIQA | WG | AVG |"
    assert table[2] == "| this checkpoint: acc | 50.00 | 25.00 | 37.50 |"
    assert table[3] == "| this checkpoint: acc_norm | 62.50 | - | - |"
    # the papers' rows for these two tasks, their AVG over their own tables' tasks marked *
    assert table[4] == "| HGRN 0.15B (HGRN paper, Table 4) | 65.02 | 50.20 | 43.94* |"
    assert "| HGRN2 2.9B (HGRN2 paper, Table 6) | 74.59 | 57.46 | 53.24* |" in table
    assert "n/v" not in "\n".join(table)
    # a local task of no paper's: no papers' rows, no caveat
    assert ours.results_table(results, ["my_local_mc"]).count("\n") == 3


# The papers' rows, copied here from ../shared/paper_tables.md (HGRN Tables 4 and 5, HGRN2 Table 6), not
# from the code under test.
PAPERS_COMMONSENSE = [
    "| HGRN 0.15B (HGRN paper, Table 4) | 59.91 | 65.02 | 33.33 | 50.20 | 46.68 | 23.81 | 28.60 | 43.94 |",
    "| HGRN 0.35B (HGRN paper, Table 4) | 59.05 | 66.70 | 38.12 | 51.70 | 49.20 | 25.26 | 30.60 | 45.80 |",
    "| HGRN 1B (HGRN paper, Table 4) | 58.69 | 70.89 | 48.02 | 51.62 | 55.64 | 27.90 | 31.60 | 49.19 |",
    "| HGRN1 0.15B (HGRN2 paper, Table 6) | - | 65.02 | 33.33 | 50.20 | 46.68 | 23.81 | 28.60 | 41.27* |",
    "| HGRN2 0.15B (HGRN2 paper, Table 6) | - | 66.43 | 35.44 | 51.70 | 46.63 | 24.32 | 28.40 | 42.15* |",
    "| HGRN1 0.35B (HGRN2 paper, Table 6) | - | 66.70 | 38.12 | 51.70 | 49.20 | 25.26 | 30.60 | 43.60* |",
    "| HGRN2 0.39B (HGRN2 paper, Table 6) | - | 69.97 | 46.16 | 52.72 | 53.58 | 23.98 | 32.40 | 46.47* |",
    "| HGRN1 1.0B (HGRN2 paper, Table 6) | - | 70.89 | 48.02 | 51.62 | 55.64 | 27.90 | 31.60 | 47.61* |",
    "| HGRN2 1.0B (HGRN2 paper, Table 6) | - | 74.16 | 54.85 | 56.12 | 58.71 | 27.22 | 34.00 | 50.84* |",
    "| HGRN2 2.9B (HGRN2 paper, Table 6) | - | 74.59 | 59.92 | 57.46 | 62.58 | 29.86 | 35.00 | 53.24* |",
    "| GLA 1.3B (HGRN2 paper, Table 6) | - | 71.90 | 49.90 | 54.40 | 61.80 | 28.40 | 34.20 | 50.10* |",
    "| Mamba 1.3B (HGRN2 paper, Table 6) | - | 71.40 | 51.20 | 54.10 | 60.10 | 30.40 | 33.80 | 50.20* |",
    "| RetNet 1.3B (HGRN2 paper, Table 6) | - | 69.80 | 47.50 | 51.10 | 58.50 | 27.40 | 31.80 | 47.68* |",
]
PAPERS_SUPERGLUE = [
    "| HGRN 0.15B (HGRN paper, Table 5) | 38.46 | 51.10 | 56.68 | 42.86 | 1.47 | 59.91 | 65.00 | 45.07 |",
    "| HGRN 0.35B (HGRN paper, Table 5) | 38.46 | 50.16 | 52.71 | 51.79 | 1.99 | 59.05 | 73.00 | 46.74 |",
    "| HGRN 1B (HGRN paper, Table 5) | 40.38 | 50.78 | 53.43 | 42.86 | 3.04 | 58.69 | 70.00 | 45.60 |",
]


def test_results_table_prints_the_papers_rows_beside_ours_with_the_acc_caveat():
    results = {"results": {name: {"acc,none": 0.5, "acc_norm,none": 0.5} for name in ours.COMMONSENSE_TASKS}}
    table = ours.results_table(results, ours.COMMONSENSE_TASKS).splitlines()
    assert table[0] == "| model | BoolQ | PIQA | HS | WG | ARC-e | ARC-c | OBQA | AVG |"
    assert table[2] == "| this checkpoint: acc | " + " | ".join(["50.00"] * 8) + " |"
    assert table[4:4 + len(PAPERS_COMMONSENSE)] == PAPERS_COMMONSENSE  # BoolQ alone does not bring Table 5 in
    text = "\n".join(table)
    assert "The papers do not say whether a column is acc or acc_norm" in text
    assert "acc_norm for HellaSwag and ARC-c, acc for the rest" in text
    assert "*: the paper's AVG over its own table's tasks" in text

    table = ours.results_table({"results": {}}, ours.SUPERGLUE_TASKS).splitlines()
    assert table[0] == "| model | WSC | WIC | RTE | CB | MultiRC | BoolQ | COPA | AVG |"
    assert table[4:4 + len(PAPERS_SUPERGLUE)] == PAPERS_SUPERGLUE
    assert "acc_norm for HellaSwag and ARC-c, acc for the rest" in table[-1]  # every AVG is over these tasks: no *


def test_eval_zero_shot_script_runs_the_papers_task_lists():
    script = open(os.path.join(os.path.dirname(PLUGIN), "scripts", "eval_zero_shot.sh")).read()
    assert "commonsense) TASKS=" + ",".join(ours.COMMONSENSE_TASKS) + " ;;" in script
    assert "superglue) TASKS=" + ",".join(ours.SUPERGLUE_TASKS) + " ;;" in script
    assert ours.COMMONSENSE_TASKS == ("boolq", "piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge",
                                      "openbookqa")  # Table 4's columns
    assert ours.SUPERGLUE_TASKS == ("wsc", "wic", "rte", "cb", "multirc", "boolq", "copa")  # Table 5's


def test_local_task_writer_refuses_a_bad_label(tmp_path):
    with pytest.raises(ours.ZeroShotError, match="document 0 of task t: needs context, choices and a label"):
        ours.write_local_multiple_choice_task(str(tmp_path), "t", [{"context": "a", "choices": [" b"], "label": 3}])


def test_install_hint_without_the_harness(monkeypatch, capsys):
    monkeypatch.setattr(ours, "_HARNESS_ERROR", ImportError("no lm_eval"))
    assert ours.main(["--path", "x.pt", "--tasks", "piqa"]) == 2
    assert "pip install -e '.[eval]'" in capsys.readouterr().err


@pytest.mark.integration
def test_eval_zero_shot_script_refuses_bad_arguments(trained, tmp_path):
    data, ckpts, _ = trained
    script = os.path.join(os.path.dirname(PLUGIN), "scripts", "eval_zero_shot.sh")
    env = dict(subprocess_env(), OUT_DIR=str(tmp_path / "out"))
    for argv, extra_env, message in [([], {}, "usage: bash scripts/eval_zero_shot.sh CKPT DATA_DIR"),
                                     ([str(tmp_path / "none.pt"), data], {}, "checkpoint .*none.pt not found"),
                                     ([ckpts["hgrn"], str(tmp_path)], {}, "dict.txt not found"),
                                     ([ckpts["hgrn"], data], {"TASK_LISTS": "glue"}, "'glue' is not commonsense or superglue")]:
        proc = pyrun.run(["bash", script, *argv], capture_output=True, text=True, env=dict(env, **extra_env))
        assert proc.returncode == 2 and re.search(message, proc.stderr), proc.stderr


def test_sentencepiece_text_becomes_the_ids_data_prep_binarised(tmp_path):
    """Our text -> ids equals data_prep's text -> pieces (spm.model) -> fairseq ids, line by line; a
    sentencepiece model other than the marker's is refused."""
    from hgrn_fairseq.preprocessing import sentencepiece_bpe
    from fairseq.data import Dictionary
    from tests.fixtures_corpus import write_plain_splits

    texts = write_plain_splits(str(tmp_path / "text"), {"train": 300, "test": 20})
    spm_dir = str(tmp_path / "spm")
    marker = sentencepiece_bpe.prepare_sentencepiece(texts, spm_dir, vocab_size=80, log=lambda *_: None)
    dictionary = Dictionary.load(os.path.join(spm_dir, "dict.txt"))
    tokenizer = ours.resolve_tokenizer(spm_dir, dictionary, None, None, None)
    assert tokenizer.kind == "sentencepiece-bpe"
    raw = open(texts["test"], encoding="utf-8").read().splitlines()
    pieces = open(os.path.join(spm_dir, "test.bpe"), encoding="utf-8").read().splitlines()
    assert len(raw) == len(pieces) == 20
    for line, encoded in zip(raw, pieces):
        expected = dictionary.encode_line(encoded, add_if_not_exist=False, append_eos=False).tolist()
        assert tokenizer.encode(line) == expected
    assert tokenizer.encode(raw[0] + "\n" + raw[1]) == tokenizer.encode(raw[0]) + [dictionary.eos()] + \
        tokenizer.encode(raw[1])
    assert tokenizer.decode(tokenizer.encode(raw[2])) == raw[2].strip()

    other = tmp_path / "other_spm"
    other.mkdir()
    with open(os.path.join(spm_dir, "spm.model"), "rb") as f:
        (other / "spm.model").write_bytes(f.read() + b"\0")  # any other file: another SHA-256
    with pytest.raises(ours.ZeroShotError, match="is not the sentencepiece model .* was encoded with"):
        ours.resolve_tokenizer(spm_dir, dictionary, None, str(other / "spm.model"), None)
    assert marker["spm_model_sha256"] == ours._sha256(os.path.join(spm_dir, "spm.model"))


GOOD_DOC = {"context": "w1 w2", "choices": [" w3", " w9"], "label": 0}


@pytest.mark.integration
@pytest.mark.parametrize("lines, message", [
    ([GOOD_DOC, {"context": "w4", "choices": [" w5", " w6", " w7"], "label": 3}],
     r"local_mc\.jsonl line 2: label 3 is out of range for its 3 choices"),
    ([GOOD_DOC, GOOD_DOC, {"context": "w4", "label": 0}], r"local_mc\.jsonl line 3: no choices"),
    ([GOOD_DOC, {"context": "w4", "choices": [], "label": 0}], r"local_mc\.jsonl line 2: no choices"),
    ([GOOD_DOC, "", '{"context": "w4", "choices": [" w5"], "label": 0'], r"local_mc\.jsonl line 3: not valid JSON"),
    ([], r"local_mc\.jsonl: no items \(the file is empty\)"),
])
def test_command_refuses_a_bad_local_task_file_by_line(tmp_path, lines, message):
    """The local task's JSONL is checked before anything loads (a checkpoint is not even needed):
    one error line naming the file and line, exit 2, no traceback."""
    include = ours.write_local_multiple_choice_task(str(tmp_path / "tasks"), "local_mc", [GOOD_DOC])
    (tmp_path / "tasks" / "local_mc.jsonl").write_text(
        "".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines))
    proc = pyrun.run([sys.executable, "-m", "hgrn_fairseq.evaluation.lm_eval", "--path", str(tmp_path / "none.pt"),
                      "--tokenizer", "space", "--device", "cpu", "--tasks", "local_mc", "--include-path", include],
                     capture_output=True, text=True, timeout=300, env=subprocess_env())
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert re.search(message, errors[0]) and str(tmp_path / "tasks" / "local_mc.jsonl") in errors[0], errors[0]


def test_local_task_check_reads_the_fields_the_yaml_names(tmp_path):
    """A hand-written task YAML with its own field names: those fields are checked; a task whose
    choices are not a plain field is checked for JSON only."""
    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"q": "a", "options": ["x", "y"], "answer": 1}) + "\n"
                    + json.dumps({"q": "b", "options": ["x", "y"], "answer": 5}) + "\n")
    (tmp_path / "qa.yaml").write_text(
        f"task: qa\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: '{{q}}'\ndoc_to_choice: '{{ options }}'\n"
        "doc_to_target: '{{answer}}'\nprocess_docs: !function utils.process\n")
    with pytest.raises(ours.ZeroShotError, match=r"qa\.jsonl line 2: label 5 is out of range for its 2 choices"):
        ours.check_local_tasks(["qa"], [str(tmp_path)])
    assert ours.check_local_task_file(str(data), None, None) == 2
    assert ours.check_local_task_file(str(data), "options", None) == 2
