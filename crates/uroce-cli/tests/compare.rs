//! `uroce compare --quick` end to end: it starts its own server on loopback, runs the reduced
//! matrix, writes the three report files, and leaves nothing running.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

use std::process::Command;

/// Every element opened is closed in order (the page is written as well-formed XML), and the
/// void elements of the head close themselves.
fn well_formed(html: &str) -> Result<(), String> {
    let body = html.strip_prefix("<!DOCTYPE html>\n").ok_or("no doctype")?;
    let mut stack: Vec<String> = Vec::new();
    let mut rest = body;
    while let Some(at) = rest.find('<') {
        let end = rest[at..].find('>').ok_or("unclosed tag")? + at;
        let tag = &rest[at + 1..end];
        rest = &rest[end + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            let open = stack.pop().ok_or(format!("</{name}> closes nothing"))?;
            if open != name {
                return Err(format!("</{name}> closes <{open}>"));
            }
        } else if !tag.ends_with('/') {
            let name = tag.split_whitespace().next().ok_or("empty tag")?;
            stack.push(name.to_string());
        }
    }
    if stack.is_empty() { Ok(()) } else { Err(format!("unclosed: {stack:?}")) }
}

#[test]
fn quick_compare_writes_a_report_whose_plots_all_have_data() {
    let dir = std::env::temp_dir().join(format!("uroce-compare-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_uroce"))
        .args(["compare", "--quick", "--local", "127.0.0.52", "--server", "127.0.0.53", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    // Standard error is a pipe here, not a terminal: no progress line rewritten in place.
    assert!(!out.stderr.contains(&b'\r'), "{}", String::from_utf8_lossy(&out.stderr));
    // The summary states the crossovers from the data.
    assert!(stdout.contains("setup: TCP connect"), "{stdout}");
    assert!(stdout.contains("an RC QP through the RDMA CM (REQ/REP/RTU)"), "{stdout}");
    // Who wins, and which way the ratio points.
    assert!(stdout.contains("latency p50: ") && stdout.contains("× lower"), "{stdout}");
    assert!(stdout.contains("bandwidth: ") && stdout.contains("× higher"), "{stdout}");
    let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
    well_formed(&html).unwrap();
    // The summary comes first, the tables are tables, and the page says what it measured on.
    let summary = html.find("<h2>Summary</h2>").expect("a summary");
    assert!(summary < html.find("<svg").unwrap(), "the summary before the plots");
    assert!(html.contains("<th>winner</th>") && html.contains("<th>messages</th>"), "tables");
    assert!(!html.contains("<pre>"), "no markdown in a <pre>");
    assert!(html.contains("Measured on ") && html.contains("cores"), "the machine");
    // Each path at 64 B and 64 KiB beside the published hardware figures, marked as quoted.
    let reference = html.find("<h3>Reference:").expect("the reference table");
    assert!(reference < html.find("<svg").unwrap(), "in the summary");
    assert!(html.contains("<td class=\"t\">uroce shm</td>"), "the shared-memory path's row");
    assert!(html.contains("quoted, not measured"), "the quoted figures are marked");
    let plots: Vec<&str> = html.split("<svg").skip(1).collect();
    assert_eq!(plots.len(), 5, "latency p50 and p99, bandwidth, CPU per GB, registration");
    for p in &plots {
        let points = p.split("points=\"").nth(1).unwrap_or("").split('"').next().unwrap_or("");
        assert!(
            points.split(' ').filter(|xy| xy.contains(',')).count() >= 2,
            "a plot without data"
        );
    }
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    for section in ["## Results", "## Setup cost", "## Crossover"] {
        assert!(md.contains(section), "{section}");
    }
    let json = std::fs::read_to_string(dir.join("results.json")).unwrap();
    for test in [
        "tcp_lat",
        "tcp_bw",
        "rc_lat",
        "rc_rdma_write_bw",
        "rc_rdma_read_lat",
        "ud_lat",
        "rc_fetch_add_mr",
    ] {
        assert!(json.contains(&format!("\"test\":\"{test}\"")), "{test} missing");
    }
    assert!(json.contains("\"crossover\":[{"), "crossovers computed");
    // A strict parser takes it, and it has the README's schema.
    let doc: serde_json::Value = serde_json::from_str(&json).expect("results.json is JSON");
    assert_eq!(doc["version"], 1);
    for key in ["host", "cpu", "cores", "kernel", "uroce", "date", "settings"] {
        assert!(doc["machine"].get(key).is_some(), "machine.{key} missing: {}", doc["machine"]);
    }
    let mut remeasured = 0;
    for r in doc["results"].as_array().unwrap() {
        for key in ["series", "peer", "test", "size", "seconds", "lost", "gbit_s", "client_cpu"] {
            assert!(r.get(key).is_some(), "{key} missing in {r}");
        }
        // Every point measured three times (the default), in rounds: the median and the spread
        // around it; five times when the three spanned more than a quarter of their median.
        let sp = &r["spread"];
        assert!(sp["runs"] == 3 || sp["runs"] == 5, "{r}");
        remeasured += usize::from(sp["runs"] == 5);
        let of = if r["latency"].is_null() { &r["gbit_s"] } else { &r["latency"]["p50_us"] };
        let (min, max, mid) = (sp["min"].as_f64(), sp["max"].as_f64(), of.as_f64());
        assert!(min <= mid && mid <= max, "the median within its spread: {r}");
        let name = if r["latency"].is_null() { "gbit_s" } else { "p50_us" };
        assert_eq!(sp["of"], name, "{r}");
        // The machine's cache-line round trip, probed before each repeat (two CPUs or more).
        if std::thread::available_parallelism().map_or(1, usize::from) >= 2 {
            let rt = r["cache_line_rt_ns"].as_array().expect("probed");
            let (lo, hi) = (rt[0].as_f64().unwrap(), rt[1].as_f64().unwrap());
            assert!(0.0 < lo && lo <= hi, "{r}");
        }
    }
    if std::thread::available_parallelism().map_or(1, usize::from) >= 2 {
        assert!(doc["machine"]["cache_line_rt_ns"].is_array(), "the run's range");
    }
    assert_eq!(doc["machine"]["remeasured"], remeasured, "{}", doc["machine"]);
    assert!(stdout.contains("repeats: the widest spread is"), "{stdout}");
    assert!(json.contains("\"rdma_cm_connect_us\":"), "the RDMA CM connection's setup");
    assert!(md.contains("connected through the RDMA connection manager"), "{md}");
    // Its server is gone: the server's RDMA address can be opened again.
    let again = uroce::Context::open_with("127.0.0.53".parse().unwrap(), uroce::Options::default());
    assert!(again.is_ok(), "a server was left running: {:?}", again.err());
    let _ = std::fs::remove_dir_all(dir);
}

/// `compare --verbs` under `uroce exec`: every RDMA measurement on every path — uroce's API
/// over shared memory, over the kernel's UDP path, and the drop-in libibverbs loaded at run
/// time — each row labelled with its path, in the same report.
#[test]
fn compare_measures_every_rdma_series_on_every_path() {
    let dir = std::env::temp_dir().join(format!("uroce-compare-verbs-{}", std::process::id()));
    // `cargo test` builds the drop-in beside the test executables.
    let libs = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let exe = env!("CARGO_BIN_EXE_uroce");
    let out = Command::new(exe)
        .env("UROCE_LIB_DIR", libs)
        .args(["exec", "--addr", "127.0.0.62", "--", exe, "compare", "--quick", "--duration"])
        .args(["0.1", "--sizes", "64,4K", "--repeat", "1", "--local", "127.0.0.62"])
        .args(["--server", "127.0.0.63"])
        .args(["--verbs", "--device", "uroce0", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let json = std::fs::read_to_string(dir.join("results.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    let rows = doc["results"].as_array().unwrap();
    let series = |r: &serde_json::Value| r["series"].as_str().unwrap().to_string();
    let shm: Vec<&serde_json::Value> =
        rows.iter().filter(|r| series(r).ends_with(" · uroce shm")).collect();
    assert!(shm.len() >= 10, "{json}");
    let paths = [" · uroce UDP", " · verbs uroce0 (GID 0 = 127.0.0.62)"];
    for path in paths {
        let on_path = rows.iter().filter(|r| series(r).ends_with(path)).count();
        assert_eq!(on_path, shm.len(), "{path}: a row for every shared-memory row: {json}");
    }
    for u in &shm {
        for path in paths {
            let label = series(u).replace(" · uroce shm", path);
            let twin = rows
                .iter()
                .find(|v| series(v) == label && v["test"] == u["test"] && v["size"] == u["size"]);
            let twin = twin.unwrap_or_else(|| panic!("no {path} row for {u}"));
            assert!(twin["bytes"].as_u64().unwrap() > 0, "{twin}");
        }
    }
    // Each uroce row says which way its client's packets went: the UDP path's through the
    // kernel only, the shared memory's never (a path silently left on shared memory would
    // measure the same); the verbs rows cannot tell.
    for r in rows.iter().filter(|r| r["test"].as_str().unwrap() != "tcp_lat") {
        let (udp, shm) = (&r["applied"]["udp_datagrams"], &r["applied"]["shm_packets"]);
        let name = series(r);
        // And the server's, which answer through the same path (a UD stream's server sends
        // nothing).
        let (server_udp, server_shm) =
            (&r["applied"]["server_udp_datagrams"], &r["applied"]["server_shm_packets"]);
        if name.ends_with(" · uroce UDP") {
            assert!(udp.as_u64().unwrap() > 0 && shm == 0, "{r}");
            assert!(server_udp.is_u64() && server_shm == 0, "{r}");
        } else if name.ends_with(" · uroce shm") {
            assert!(shm.as_u64().unwrap() > 0 && udp == 0, "{r}");
            assert!(server_shm.is_u64() && server_udp == 0, "{r}");
        } else if name.contains(" · verbs ") {
            assert!(udp.is_null() && shm.is_null(), "{r}");
            assert!(server_udp.is_null() && server_shm.is_null(), "{r}");
        }
    }
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    for path in paths {
        assert!(md.contains(path), "the report names {path}'s rows");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `--with-peers` runs perftest's five tools on uroce's devices through the drop-in (under
/// `uroce exec`), beside the harness's own RDMA rows.
#[test]
fn with_peers_perftest_measures_the_rdma_side_too() {
    if !uroce_testkit::installed(&["ib_send_lat", "ib_write_bw"], "perftest") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("uroce-compare-peers-{}", std::process::id()));
    let libs = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let out = Command::new(env!("CARGO_BIN_EXE_uroce"))
        .env("UROCE_LIB_DIR", libs)
        .args(["compare", "--quick", "--duration", "0.1", "--sizes", "4K", "--with-peers"])
        .args(["--repeat", "1"])
        .args(["--local", "127.0.0.72", "--server", "127.0.0.73", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json = std::fs::read_to_string(dir.join("results.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    let perftest: Vec<&serde_json::Value> = doc["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["series"].as_str().unwrap().starts_with("peer: perftest"))
        .collect();
    let tests: Vec<&str> = perftest.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(
        tests,
        ["rc_lat", "rc_rdma_write_lat", "rc_rdma_read_lat", "rc_bw", "rc_rdma_write_bw"],
        "{json}"
    );
    for r in perftest {
        assert_eq!(r["peer"], true);
        let figure = if r["latency"].is_null() { &r["gbit_s"] } else { &r["latency"]["p50_us"] };
        assert!(figure.as_f64().unwrap() > 0.0, "{r}");
    }
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("`ib_send_lat`") && md.contains("under `uroce exec`"), "{md}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Waits for another process to move on.
#[expect(clippy::disallowed_methods, reason = "the test waits for another process")]
fn pause(ms: u64) {
    std::thread::sleep(std::time::Duration::from_millis(ms));
}

/// The pid of a running `uroce server` on `addr`.
fn server_pid(addr: &str) -> Option<String> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<String> =
            cmd.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).to_string()).collect();
        // The binary itself, not a shell whose command line mentions it.
        let uroce = args.first().is_some_and(|a| a.ends_with("/uroce"));
        (uroce && args.get(1).is_some_and(|a| a == "server") && args.iter().any(|a| a == addr))
            .then(|| e.file_name().to_string_lossy().to_string())
    })
}

/// The server `uroce compare` starts ends with whatever started it, even when that is killed
/// outright and no destructor runs (`UROCE_DIE_WITH_PARENT`, which compare sets). Here a shell
/// stands in for compare, so nothing else (a broken pipe, a closed connection) ends the server.
#[test]
fn a_server_started_by_compare_dies_with_its_parent() {
    let exe = env!("CARGO_BIN_EXE_uroce");
    let script = format!(
        "UROCE_DIE_WITH_PARENT=$$ {exe} server --addr 127.0.0.64 --port 19811 2>/dev/null & wait"
    );
    let mut parent = Command::new("sh").args(["-c", &script]).spawn().unwrap();
    let mut started = false;
    for _ in 0..150 {
        if server_pid("127.0.0.64").is_some() {
            started = true;
            break;
        }
        pause(20);
    }
    assert!(started, "the server did not start");
    parent.kill().unwrap();
    parent.wait().unwrap();
    let mut gone = false;
    for _ in 0..150 {
        if server_pid("127.0.0.64").is_none() {
            gone = true;
            break;
        }
        pause(20);
    }
    if let Some(pid) = server_pid("127.0.0.64") {
        let _ = Command::new("kill").arg(pid).status();
    }
    assert!(gone, "the server outlived the process that started it");
}
