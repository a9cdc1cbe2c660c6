//! StopPodSandbox's CNI DEL policy: a failed DEL is an error and keeps the netns for the next
//! Stop, which retries it; after `cni_del_max_attempts` failures (3 in these tests) the
//! network is given up on, the attachment is kept in the CNI cache for the start-up retry,
//! and the rest of the stop goes on.

use super::*;
use Op::*;

/// The calls of a stop that gets past the DEL: namespaces (net, IPC, UTS), then the shm.
const AFTER_DEL: &[Op] = &[RemoveNamespace, RemoveNamespace, RemoveNamespace, Unmount];

#[test]
fn failed_del_is_an_error_and_retried_by_the_next_stop() {
    let h = Harness::new("del-retry");
    let id = ready(&h, &pod("del-retry"));
    let netns = h.record(&id).netns.unwrap();
    h.fake.fail_next(CniDel, 1);

    let err = h.rt.stop_pod_sandbox(&id).expect_err("DEL failed");
    assert_eq!(step(&err), "tear down network", "{err}");
    assert_eq!(h.ops(), [CniDel], "nothing after the failed DEL");
    assert_eq!(h.args(CniDel), [netns.display().to_string()]);
    let r = h.record_on_disk(&id);
    assert_eq!(r.state, SandboxState::NotReady);
    assert_eq!(r.network.del_failures, 1);
    assert!(!r.network.stopped && !r.network.gave_up);
    assert!(r.network.last_del_error.is_some());
    assert_eq!(
        h.fake.namespaces().len(),
        3,
        "the netns is kept for the retry"
    );

    h.fake.clear();
    h.rt.stop_pod_sandbox(&id).expect("the retried DEL works");
    assert_eq!(h.ops(), [&[CniDel][..], AFTER_DEL].concat());
    let r = h.record_on_disk(&id);
    assert!(r.network.stopped && !r.network.gave_up);
    assert_eq!(r.network.last_del_error, None);
    assert_eq!(r.network.del_failures, 1);

    h.fake.clear();
    h.rt.stop_pod_sandbox(&id).expect("a repeated stop");
    assert_eq!(h.ops(), [], "a repeated stop is a no-op");
    h.rt.remove_pod_sandbox(&id).unwrap();
    assert_eq!(h.ops(), [RemoveCgroup]);
    h.assert_nothing_left();
}

#[test]
fn del_is_given_up_after_max_attempts_and_its_cache_kept() {
    let h = Harness::new("del-give-up");
    let id = ready(&h, &pod("del-give-up"));
    h.fake.fail(CniDel);

    for attempt in 1..=2 {
        h.fake.clear();
        let err = h.rt.stop_pod_sandbox(&id).expect_err("DEL failed");
        assert_eq!(step(&err), "tear down network", "{err}");
        assert_eq!(h.ops(), [CniDel], "attempt {attempt}");
        let r = h.record_on_disk(&id);
        assert_eq!(r.network.del_failures, attempt);
        assert!(!r.network.gave_up, "attempt {attempt}");
    }

    // The third failure: given up, the stop goes on and succeeds.
    h.fake.clear();
    h.rt.stop_pod_sandbox(&id)
        .expect("given up: the stop finishes");
    assert_eq!(h.ops(), [&[CniDel, CniSaveCache][..], AFTER_DEL].concat());
    let r = h.record_on_disk(&id);
    assert_eq!(r.network.del_failures, 3);
    assert!(r.network.gave_up && r.network.stopped);
    assert!(r.network.last_del_error.is_some());
    assert_eq!(
        h.rt.pod_sandbox_status(&id).unwrap().network_error,
        r.network.last_del_error,
        "the DEL error is reported"
    );
    let cached = h.rt.cni.load_cache(&id).expect("the cache is kept");
    assert!(cached.result.is_some(), "with the ADD result DEL needs");

    h.fake.clear();
    h.rt.stop_pod_sandbox(&id).expect("a repeated stop");
    assert_eq!(h.ops(), [], "no DEL once given up");

    // Removal leaves the cache for the start-up retry.
    h.rt.remove_pod_sandbox(&id).unwrap();
    assert_eq!(h.ops(), [RemoveCgroup]);
    assert!(h.cache_file(&id).is_file(), "kept for the start-up retry");
    assert!(
        h.rt.sandbox_record(&id).is_err(),
        "the sandbox itself is gone"
    );
}

/// `cni_del_max_attempts = 0`: DEL is never given up on.
#[test]
fn del_is_never_given_up_with_max_attempts_zero() {
    let h = Harness::with("del-forever", |c| c.cni_del_max_attempts = 0);
    let id = ready(&h, &pod("del-forever"));
    h.fake.fail(CniDel);
    for _ in 0..5 {
        h.rt.stop_pod_sandbox(&id).expect_err("DEL failed");
    }
    let r = h.record_on_disk(&id);
    assert_eq!(r.network.del_failures, 5);
    assert!(!r.network.gave_up && !r.network.stopped);
    assert_eq!(h.ops(), [CniDel; 5]);
}

/// A netns that vanished: DEL runs with an empty `CNI_NETNS`, as the spec allows.
#[test]
fn del_gets_no_netns_when_it_is_gone() {
    let h = Harness::new("del-no-netns");
    let id = ready(&h, &pod("del-no-netns"));
    h.fake.lose_namespace(&h.record(&id).netns.unwrap());
    h.rt.stop_pod_sandbox(&id).unwrap();
    assert_eq!(h.args(CniDel), [""]);
}

/// With an infra container: it is killed (and its exit waited for) before the DEL.
#[test]
fn stop_kills_the_infra_before_the_del() {
    let h = Harness::new("stop-infra");
    let id = ready(&h, &infra_pod("stop-infra"));
    h.rt.stop_pod_sandbox(&id).unwrap();
    assert_eq!(
        h.ops(),
        [RuntimeKill, WaitExit, CniDel, RemoveNamespace, Unmount]
    );
    assert_eq!(h.fake.containers()[&id], "stopped");
    h.fake.clear();
    h.rt.remove_pod_sandbox(&id).unwrap();
    assert_eq!(h.ops(), [RuntimeDelete, RemoveCgroup]);
    h.assert_nothing_left();
}
