"""Part 4 of make bench: each input mode (--input=memory, stream, files) at -np 2: rank
0's input pipeline alone, the record bytes a rank reads per epoch, and a short training
run's images/s and peak RSS per rank."""

from tools.bench import in_process, tables, training_run

RUN_STEPS = 60  # per epoch, 2 epochs: long enough for steady state and a full RSS


def measure(data_dir: str, sharded_data_dir: str, out_dir: str) -> dict:
    from hvd_mnist.data import inputs
    out = {}
    for mode in ("memory", "stream", "files"):
        mode_data_dir = sharded_data_dir if mode == "files" else data_dir
        pipeline = in_process.pipeline_images_per_second(mode_data_dir, 128, size=2, mode=mode)
        run = training_run.measure(f"input_{mode}_np2", 2, [
            f"--input={mode}", "--epochs=2", f"--max_steps_per_epoch={RUN_STEPS}",
            "--log_every=0"], mode_data_dir, out_dir, timeout_seconds=900)
        per_rank_training = run["images_per_second"] / 2
        out[mode] = {
            "data_dir": mode_data_dir,
            "pipeline_images_per_second_per_rank": pipeline,
            "training_images_per_second_per_rank": per_rank_training,
            "pipeline_over_training": pipeline / per_rank_training,
            "peak_rss_mib_per_rank": run["peak_rss_mib_per_rank"],
            "record_bytes_per_rank_per_epoch": inputs.bytes_per_epoch(
                mode_data_dir, mode, inputs.Shard(0, 2)),
        }
        print(f"input {mode}: pipeline {pipeline:.0f} images/s per rank, "
              f"{out[mode]['pipeline_over_training']:.0f}x training", flush=True)
    return out


def table(modes: dict) -> str:
    f = tables.figure
    rows = [[mode, f(m["pipeline_images_per_second_per_rank"]),
             tables.ratio(m["pipeline_over_training"]),
             ", ".join(f(r) for r in m["peak_rss_mib_per_rank"]),
             (f"{f(m['record_bytes_per_rank_per_epoch'] / 2**20)} MiB" if mode != "memory"
              else "0 (the split, read once per run)")]
            for mode, m in modes.items()]
    return tables.markdown(["--input (-np 2)", "pipeline images/s per rank",
                            "pipeline / training per rank", "peak RSS MiB per rank",
                            "record bytes per rank per epoch"], rows)
