use super::*;

fn link(latency_ns: u64, gbps: f64) -> Link {
    Link {
        latency_ns,
        bytes_per_s: gbps * 1e9 / 8.0,
        loss: 0.0,
    }
}

/// xPyD: router → prefill (x) → decode (y) → playback.
fn pd(x: u32, y: u32) -> (Vec<Stage>, Vec<LinkSpec>) {
    (
        vec![
            stage("router", Role::Router, 1),
            stage("prefill", Role::Prefill, x),
            stage("decode", Role::Decode, y),
            stage("playback", Role::Playback, 1),
        ],
        vec![
            spec("router", "prefill", Link::LOCAL),
            spec("prefill", "decode", link(500_000, 400.0)),
            spec("decode", "playback", Link::LOCAL),
        ],
    )
}

fn error(stages: Vec<Stage>, links: Vec<LinkSpec>) -> Invalid {
    Topology::new(stages, links).expect_err("an invalid graph")
}

#[test]
fn colocated_and_xpyd_graphs_are_valid() {
    assert!(Topology::colocated(4).is_colocated());
    let (s, l) = pd(2, 1);
    let t = Topology::new(s, l).unwrap();
    assert!(!t.is_colocated());
    let replicas: Vec<u32> = t.stages().map(|s| s.replicas).collect();
    assert_eq!(replicas, [1, 2, 1, 1]);
}

#[test]
fn a_cycle_is_refused() {
    let (s, mut l) = pd(1, 1);
    l.push(spec("decode", "prefill", Link::LOCAL));
    let e = error(s, l);
    assert_eq!(e.field, "topology.links");
    assert!(e.message.contains("cycle"), "{e:?}");
}

#[test]
fn a_path_that_skips_decoding_is_refused_by_the_dominators() {
    // router → prefill → decode → playback, and also prefill → playback directly.
    let (s, mut l) = pd(1, 1);
    l.push(spec("prefill", "playback", Link::LOCAL));
    let e = error(s, l);
    assert!(e.message.contains("without passing a Decode"), "{e:?}");
}

#[test]
fn a_decode_stage_needs_a_kv_source() {
    let stages = vec![
        stage("router", Role::Router, 1),
        stage("decode", Role::Decode, 1),
        stage("playback", Role::Playback, 1),
    ];
    let links = vec![
        spec("router", "decode", Link::LOCAL),
        spec("decode", "playback", Link::LOCAL),
    ];
    let e = error(stages, links);
    assert!(e.message.contains("no KV source"), "{e:?}");
}

#[test]
fn a_serving_role_without_replicas_names_its_field() {
    let (mut s, l) = pd(1, 1);
    s[2].replicas = 0;
    let e = error(s, l);
    assert_eq!(e.field, "topology.stages[2].replicas");
}

#[test]
fn names_router_playback_and_reachability_are_checked() {
    let (mut s, l) = pd(1, 1);
    s[3].name = "decode".into();
    assert_eq!(error(s, l).field, "topology.stages[3].name");
    let (s, mut l) = pd(1, 1);
    l[1].to = "decoder".into();
    assert_eq!(error(s, l).field, "topology.links[1].to");
    let (mut s, l) = pd(1, 1);
    s.push(stage("router2", Role::Router, 1));
    assert!(error(s, l).message.contains("exactly one Router"));
    let (mut s, l) = pd(1, 1);
    s.push(stage("orphan", Role::Decode, 1));
    assert!(error(s, l).message.contains("off every path"));
    let (s, mut l) = pd(1, 1);
    l[1].link.loss = 1.5;
    assert_eq!(error(s, l).field, "topology.links[1].loss");
}

#[test]
fn a_transfer_takes_latency_plus_bytes_over_bandwidth() {
    // 2,048 tokens x 128 KiB per token over 400 Gb/s: 268,435,456 B / 5e10 B/s = 5.368709 ms.
    let l = link(500_000, 400.0);
    assert_eq!(l.transfer_ns(2048 * 131_072), 500_000 + 5_368_710);
    assert_eq!(Link::LOCAL.transfer_ns(1 << 30), 0);
}

#[test]
fn the_dot_export_names_every_stage_and_link() {
    let (s, l) = pd(2, 1);
    let dot = Topology::new(s, l).unwrap().to_dot();
    for want in [
        "digraph",
        "prefill\\nPrefill x2",
        "decode\\nDecode x1",
        "0.5 ms, 400 Gb/s, loss 0",
        "0 -> 1",
        "1 -> 2",
        "2 -> 3",
    ] {
        assert!(dot.contains(want), "missing {want:?} in\n{dot}");
    }
}

#[test]
fn a_name_in_an_error_stays_on_one_line_and_short() {
    let mut stages = vec![
        stage("router", Role::Router, 1),
        stage("pre\nfill", Role::Prefill, 1),
        stage("playback", Role::Playback, 1),
    ];
    let e = Topology::new(stages.clone(), vec![]).unwrap_err();
    assert!(
        !e.message.contains('\n') && e.message.contains("pre\\nfill"),
        "{}",
        e.message
    );
    stages[1].name = "x".repeat(10_000);
    let e = Topology::new(stages, vec![]).unwrap_err();
    assert!(e.message.len() < 200, "{}", e.message);
}
