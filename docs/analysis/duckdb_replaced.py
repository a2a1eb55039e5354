# A merged file lists the files it replaces in its `vtax.compacted_from`
# metadata. vtax deletes them before the merged file takes a name that
# `*.parquet` matches, but an older vtax published it first: a kill or a copy
# between the two left both, for good in a copy, and a plain glob counts
# their rows twice. This view reads the metadata and skips the replaced
# files, as vtax's own readers do.
import os

import duckdb

STORE = os.environ.get("VTAX_STORE", "/var/lib/vtax")
files = f"{STORE}/tables/gpu/*/*.parquet"
con = duckdb.connect()
con.sql(f"""
    CREATE VIEW gpu AS
    SELECT * EXCLUDE (filename)
    FROM read_parquet('{files}', hive_partitioning = true, filename = true)
    WHERE parse_filename(filename) NOT IN (
        SELECT unnest(string_split(decode(value), ','))
        FROM parquet_kv_metadata('{files}')
        WHERE decode(key) = 'vtax.compacted_from'
    )
""")
counts = con.sql(f"""
    SELECT (SELECT count(*) FROM read_parquet('{files}')) AS rows_in_all_files,
           (SELECT count(*) FROM gpu)                    AS rows
""")
counts.show()
