"""inferrt.ray on a local Ray cluster of two nodes (ray.cluster_utils.Cluster: a head and a
second raylet on this machine, each with its own worker processes): every row comes out
once with LLM.generate's text (itself checked against transformers in test_llm.py); an actor
whose process dies mid-batch is restarted and its rows retried; run_jsonl writes every row;
an actor over a tensor-parallel plan (mpirun -n 2 inferrt serve) gives the same text."""
import glob
import json
import os
import shutil

import pytest

import inferrt
from inferrt import SamplingParams

ray = pytest.importorskip("ray", reason="ray is not installed (tools/requirements-test.txt)")
from ray.cluster_utils import Cluster  # noqa: E402

from conftest import ROOT  # noqa: E402

N_ROWS = 48


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    env = {k: os.environ[k] for k in ("INFERRT_LIB", "INFERRT_INFC", "INFERRT_CLI")
           if k in os.environ}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "python"),
                                         os.path.join(ROOT, "tests", "python")])
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    c = Cluster(initialize_head=True,
                head_node_args={"num_cpus": 2, "object_store_memory": 100 * 2**20,
                                "include_dashboard": False})
    c.add_node(num_cpus=2, object_store_memory=100 * 2**20)
    ray.init(address=c.address, runtime_env={"env_vars": env}, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    yield c
    ray.shutdown()
    c.shutdown()


def rows():
    return [{"id": i, "prompt": "Row %d says" % i} for i in range(N_ROWS)]


def want(text_llm):
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outs = text_llm.generate([r["prompt"] for r in rows()], sp, use_tqdm=False)
    return {i: o.outputs[0].text for i, o in enumerate(outs)}


def by_id(results):
    got = {}
    for r in results:
        assert int(r["id"]) not in got, "row %s came out twice" % r["id"]
        got[int(r["id"])] = r
    return got


def test_every_row_once_across_nodes(cluster, text_plan, text_llm):
    from inferrt.ray import build_processor
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    process = build_processor(text_plan, sp, concurrency=2, batch_size=8, threads=1,
                              kv_tokens=4096)
    got = by_id(process(ray.data.from_items(rows())).take_all())
    ref = want(text_llm)
    assert sorted(got) == list(range(N_ROWS))
    assert all(got[i]["generated_text"] == ref[i] for i in got)
    assert all(int(got[i]["num_generated_tokens"]) == 8 for i in got)


def test_killed_actor_retried(cluster, text_plan, text_llm, tmp_path):
    flag = str(tmp_path / "crashed")
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    ds = ray.data.from_items(rows()).map_batches(
        __import__("ray_helpers").CrashOnce,
        fn_constructor_kwargs=dict(flag_file=flag, marker="Row 21 says", model=text_plan,
                                   sampling_params=sp, threads=1, kv_tokens=4096),
        concurrency=2, batch_size=8, num_cpus=1, batch_format="numpy")
    got = by_id(ds.take_all())
    assert os.path.exists(flag), "no actor died: the test did not test a retry"
    ref = want(text_llm)
    assert sorted(got) == list(range(N_ROWS))
    assert all(got[i]["generated_text"] == ref[i] for i in got)


def test_run_jsonl(cluster, text_plan, text_llm, tmp_path):
    from inferrt.ray import run_jsonl
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    out = tmp_path / "out"
    run_jsonl(text_plan, str(src), str(out), SamplingParams(temperature=0, max_tokens=8,
                                                             ignore_eos=True),
              concurrency=2, batch_size=16, threads=1, kv_tokens=4096)
    res = [json.loads(line) for f in glob.glob(str(out / "*.json")) for line in open(f)]
    got = by_id(res)
    ref = want(text_llm)
    assert sorted(got) == list(range(N_ROWS))
    assert all(got[i]["generated_text"] == ref[i] for i in got)


def test_tensor_parallel_actor(cluster, text_llm, tmp_path):
    if not shutil.which("mpirun"):
        pytest.fail("mpirun is missing (tools/bootstrap installs openmpi-bin)")
    from inferrt.ray import build_processor
    plan = inferrt.build(os.path.join(ROOT, "tests", "fixtures", "llama-text"),
                         tmp_path / "tp2.plan", tp=2, quiet=True)
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    process = build_processor(str(plan), sp, concurrency=1, batch_size=16, num_cpus=1,
                              tensor_parallel_size=2, threads=1, kv_tokens=4096)
    got = by_id(process(ray.data.from_items(rows())).take_all())
    ref = want(text_llm)
    assert sorted(got) == list(range(N_ROWS))
    assert all(got[i]["generated_text"] == ref[i] for i in got)
