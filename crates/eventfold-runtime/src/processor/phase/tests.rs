//! Every (phase, event) pair of the lifecycle: the allowed transitions and the refused ones.

use super::*;
use PartitionState as S;

fn recovering(reason: &str) -> Phase {
    Phase::Recovering { reason: reason.into() }
}

fn revoking(shown: PartitionState) -> Phase {
    Phase::Revoking { shown }
}

fn commit_failed(reason: &str) -> Event {
    Event::CommitFailed { reason: reason.into() }
}

/// Every phase there is (revoking in each state it can show).
fn phases() -> Vec<Phase> {
    vec![
        Phase::Remote,
        Phase::Restoring,
        Phase::Ready,
        recovering("first"),
        revoking(S::Remote),
        revoking(S::Restoring),
        revoking(S::Ready),
        revoking(S::Failed),
        Phase::Failed,
    ]
}

fn events() -> Vec<Event> {
    vec![
        Event::Assigned,
        Event::Restored,
        commit_failed("second"),
        Event::Revoked,
        Event::Drained,
        Event::Stopped,
    ]
}

/// The allowed transitions; every other pair of [`phases`] and [`events`] is refused.
fn allowed() -> Vec<(Phase, Event, Phase)> {
    use Event as E;
    use Phase as P;
    let mut t = vec![
        (P::Remote, E::Assigned, P::Restoring),
        (P::Remote, E::Revoked, revoking(S::Remote)),
        (P::Restoring, E::Assigned, P::Restoring),
        (P::Restoring, E::Restored, P::Ready),
        (P::Restoring, E::Revoked, revoking(S::Restoring)),
        (P::Restoring, E::Stopped, P::Failed),
        (P::Ready, E::Assigned, P::Restoring),
        (P::Ready, commit_failed("second"), recovering("second")),
        (P::Ready, E::Revoked, revoking(S::Ready)),
        (P::Ready, E::Stopped, P::Failed),
        (recovering("first"), E::Assigned, P::Restoring),
        (recovering("first"), E::Restored, P::Ready),
        // The units built on the failed one fail too: the first failure names the recovery.
        (recovering("first"), commit_failed("second"), recovering("first")),
        (recovering("first"), E::Revoked, revoking(S::Restoring)),
        (recovering("first"), E::Stopped, P::Failed),
        (P::Failed, E::Assigned, P::Restoring),
        // A commit in flight when the partition stopped fails (Kafka): it recovers.
        (P::Failed, commit_failed("second"), recovering("second")),
        (P::Failed, E::Revoked, revoking(S::Failed)),
        (P::Failed, E::Stopped, P::Failed),
    ];
    for shown in [S::Remote, S::Restoring, S::Ready, S::Failed] {
        t.push((revoking(shown), commit_failed("second"), revoking(S::Restoring)));
        t.push((revoking(shown), E::Drained, P::Remote));
    }
    t
}

#[test]
fn every_transition_is_allowed_or_refused_as_the_table_says() {
    let allowed = allowed();
    let mut checked = 0;
    for phase in phases() {
        for event in events() {
            let expected = allowed
                .iter()
                .find(|(p, e, _)| *p == phase && *e == event)
                .map(|(_, _, next)| next.clone());
            let got = phase.on(event.clone());
            match expected {
                Some(next) => assert_eq!(got, Ok(next), "{phase:?} on {event:?}"),
                None => assert_eq!(
                    got,
                    Err(Refused {
                        phase: phase.clone(),
                        event: event.clone()
                    }),
                    "{phase:?} on {event:?} must be refused"
                ),
            }
            checked += 1;
        }
    }
    assert_eq!(checked, phases().len() * events().len());
    // Every row of the table is a pair of the enumeration (no typo hides a row).
    for (p, e, _) in &allowed {
        assert!(phases().contains(p) && events().contains(e), "{p:?} on {e:?}");
    }
}

#[test]
fn a_phase_shows_the_partition_state_of_today() {
    assert_eq!(Phase::Remote.shown(), S::Remote);
    assert_eq!(Phase::Restoring.shown(), S::Restoring);
    assert_eq!(Phase::Ready.shown(), S::Ready);
    assert_eq!(recovering("x").shown(), S::Restoring);
    assert_eq!(Phase::Failed.shown(), S::Failed);
    for shown in [S::Remote, S::Restoring, S::Ready, S::Failed] {
        assert_eq!(revoking(shown).shown(), shown);
    }
}

#[test]
fn what_a_phase_takes() {
    let takes = |p: Phase| (p.owned(), p.takes_jobs(), p.takes_control());
    assert_eq!(takes(Phase::Remote), (false, true, true));
    assert_eq!(takes(Phase::Restoring), (true, false, true));
    assert_eq!(takes(Phase::Ready), (true, true, true));
    assert_eq!(takes(recovering("x")), (true, false, true));
    assert_eq!(takes(revoking(S::Ready)), (true, false, false));
    assert_eq!(takes(Phase::Failed), (true, true, true));
}

#[test]
fn a_revocation_then_a_drain_gives_the_partition_up_whatever_came_before() {
    for start in [
        Phase::Remote,
        Phase::Restoring,
        Phase::Ready,
        recovering("x"),
        Phase::Failed,
    ] {
        let revoking = start.on(Event::Revoked).expect("revocable");
        assert_eq!(revoking.shown(), start.shown());
        assert_eq!(revoking.on(Event::Drained), Ok(Phase::Remote));
    }
}
