# pandas over one node's store, through a pyarrow dataset: the filter is
# applied while reading (partitions, then row groups), pandas gets the rest.
import os

import pandas as pd
import pyarrow.dataset as ds

STORE = os.environ.get("VTAX_STORE", "/var/lib/vtax")
since = pd.Timestamp.now(tz="UTC") - pd.Timedelta(hours=1)


def read(table, columns):
    dataset = ds.dataset(f"{STORE}/tables/{table}", format="parquet", partitioning="hive")
    # `date` is the partition, read as text: ISO dates compare as strings.
    wanted = (ds.field("date") >= since.strftime("%Y-%m-%d")) & (ds.field("time") >= since)
    return dataset.to_table(columns=columns, filter=wanted).to_pandas()


# Per GPU: mean utilisation and HBM against peak.
gpu = read("gpu", ["time", "gpu", "utilization_ratio", "hbm_bytes_per_second",
                   "hbm_peak_bytes_per_second"])
gpu["hbm_of_peak"] = gpu["hbm_bytes_per_second"] / gpu["hbm_peak_bytes_per_second"]
per_gpu = gpu.groupby("gpu", observed=True)[["utilization_ratio", "hbm_of_peak"]].mean()
print(per_gpu)

# Wake-up p99 per minute and CPU, in microseconds: a frame to plot or eyeball.
jitter = read("jitter", ["time", "cpu", "wakeup_p99_seconds"])
p99_us = jitter.pivot_table(index=pd.Grouper(key="time", freq="1min"), columns="cpu",
                            values="wakeup_p99_seconds", aggfunc="max", observed=True) * 1e6
print(p99_us)
