"""A target on one GPU against the same target split over two: bitwise logits and step costs.

    python benchmarks/two_gpus.py --target /tmp/fp/llama-3.1/target [--steps 32] [--out two.json]

Loads the checkpoint twice as specgen's own model (core/step/load.py; whole on the last GPU, and
over every GPU as the loader places a `device_map = "balanced"`: core/step/load.py's spread),
builds each a CUDA-backend runner (captured 1- and 5-token steps), prefills the same prompt,
then decodes greedily step by step, checking at every step that both give the same logits bit for
bit, and at the end a 5-token step. Then it times graph replays of both shapes (CUDA events,
median of 5 runs of 20 replays), so the table says what a step pays for the split. Needs two GPUs.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch


def load_owned(folder: str, home: torch.device, strategy: str | None = None):
    """The checkpoint as specgen's own model in bf16: whole on `home`, or placed by a device_map
    strategy (its layout: module name -> device, as the loader plans it)."""
    import json
    from pathlib import Path

    from specgen.core.step import config as step_config
    from specgen.core.step.load import load, spread

    data = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    config = step_config.of(data)
    if config is None:
        raise SystemExit(f"two_gpus: specgen's own step does not run {folder}: {step_config.unsupported(data)}")
    layout = spread(config, torch.bfloat16, strategy, None) if strategy else None
    return load(Path(folder), config, torch.bfloat16, home, layout), layout


def runner_for(model, profile, home: torch.device):
    from specgen.gpu.backend import CudaBackend

    width = model.get_output_embeddings().weight.shape[0]
    return CudaBackend(home, profile).runner(model, width, 1024, "target", shapes=(1, 5))


def replay_ms(runner, shape: int, repeats: int = 20, runs: int = 5) -> float:
    """Median over `runs` of the mean time of `repeats` replays of the `shape`-token step."""
    graph, start = runner.graphs[shape].graph, runner.length
    times = []
    for _ in range(runs + 1):  # the first run warms up
        runner.position.fill_(start)
        with torch.cuda.device(runner.device):  # events on the home stream, where every replay ends
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(repeats):
                graph.replay()
            end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / repeats)
    runner.position.fill_(start)
    return statistics.median(times[1:])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    from specgen.core.settings import ModelSpec, Profile

    profile = Profile("two-gpus", "<probe>", ModelSpec(args.target))
    home = torch.device("cuda", torch.cuda.device_count() - 1)
    whole, _ = load_owned(args.target, home)
    split, layout = load_owned(args.target, home, "balanced")
    placed = {str(d) for d in layout.values()}
    assert split.get_output_embeddings().weight.device == home, "balanced put the output projection elsewhere"
    runners = [runner_for(whole, profile, home), runner_for(split, profile, home)]
    assert runners[0].stages is None and runners[1].stages is not None
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, whole.config.vocab_size, (128,), generator=generator).to(home)
    logits = [r.forward(prompt).clone() for r in runners]
    equal = [torch.equal(*logits)]
    token = logits[0][-1:].argmax(-1)
    for _ in range(args.steps):
        logits = [r.forward(token).clone() for r in runners]
        equal.append(torch.equal(*logits))
        token = logits[0].argmax(-1)
    feed = torch.randint(0, whole.config.vocab_size, (5,), generator=generator).to(home)
    equal.append(torch.equal(*[r.forward(feed).clone() for r in runners]))
    result = {"gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
              "placement": runners[1].stages.describe(), "hf_devices": sorted(placed),
              "steps_checked": len(equal), "bitwise_equal": all(equal), "unequal_steps": equal.count(False)}
    for name, runner in zip(("one_gpu", "split"), runners):
        for shape in (1, 5):
            result[f"{name}_step_{shape}_ms"] = round(replay_ms(runner, shape), 4)
    for shape in (1, 5):
        result[f"split_cost_{shape}_ms"] = round(result[f"split_step_{shape}_ms"] - result[f"one_gpu_step_{shape}_ms"], 4)
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as file:
            json.dump(result, file, indent=1)


if __name__ == "__main__":
    main()
