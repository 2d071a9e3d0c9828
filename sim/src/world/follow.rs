//! What follows an event: the events the world's handlers and components ask for, in the order
//! they ask. Components push here instead of scheduling (as a replica's scheduler appends to
//! its `Outbox`); only `World` hands them to the kernel, once per dispatched event, each at its
//! event's own tie class (`Event::class`). The kernel's sequence numbers are given in the order
//! asked, so moving a push between a component and the world changes no run.

use super::event::Event;
use crate::kernel::{Kernel, LimitError};

/// When an event asked for fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum When {
    /// At this virtual time (never before now).
    At(u64),
    /// This long after now.
    After(u64),
    /// This long after now, weak: it does not keep a finished run alive (a client's timer).
    WeakAfter(u64),
}

/// The events asked for while one event is handled, and the virtual time it is handled at.
#[derive(Debug, Default)]
pub(crate) struct Follow {
    now_ns: u64,
    asked: Vec<(When, Event)>,
}

impl Follow {
    /// Handling an event at `now_ns` begins: nothing may be left from the one before.
    pub fn open(&mut self, now_ns: u64) {
        assert!(
            self.asked.is_empty(),
            "events asked for were never scheduled"
        );
        assert!(
            now_ns >= self.now_ns,
            "time went back: {now_ns} < {}",
            self.now_ns
        );
        self.now_ns = now_ns;
    }

    /// The virtual time of the event being handled.
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    pub fn at(&mut self, time_ns: u64, ev: Event) {
        assert!(
            time_ns >= self.now_ns,
            "{ev:?} asked for in the past: {time_ns} < now {}",
            self.now_ns
        );
        self.asked.push((When::At(time_ns), ev));
    }

    pub fn after(&mut self, delay_ns: u64, ev: Event) {
        self.asked.push((When::After(delay_ns), ev));
    }

    /// Weak: the run ends when only weak events are left, unless something still waits on one.
    pub fn weak_after(&mut self, delay_ns: u64, ev: Event) {
        self.asked.push((When::WeakAfter(delay_ns), ev));
    }

    /// The event asked for last, if it is a scheduler pass at this tick: taken back, for the
    /// world to run at once or schedule itself.
    #[inline]
    pub fn take_last_pass(&mut self) -> Option<Event> {
        match self.asked.last() {
            Some(&(When::After(0), ev @ Event::SchedulePass { .. })) => {
                self.asked.pop();
                Some(ev)
            }
            _ => None,
        }
    }

    /// Into the kernel, in the order asked; empty after, even when a limit stops it.
    pub fn schedule(&mut self, k: &mut Kernel<Event>) -> Result<(), LimitError> {
        let mut scheduled = Ok(());
        for &(when, ev) in &self.asked {
            let class = ev.class();
            scheduled = match when {
                When::At(t) => k.schedule_at(t, class, ev),
                When::After(d) => k.schedule_in(d, class, ev),
                When::WeakAfter(d) => k.schedule_weak_in(d, class, ev),
            };
            if scheduled.is_err() {
                break;
            }
        }
        self.asked.clear();
        scheduled
    }

    /// The ticks of the events asked for, in the order asked, onto `out`.
    pub fn ticks(&self, out: &mut Vec<u64>) {
        out.extend(self.asked.iter().map(|&(when, _)| match when {
            When::At(t) => t,
            When::After(d) | When::WeakAfter(d) => self.now_ns.saturating_add(d),
        }));
    }

    #[cfg(test)]
    fn asked(&self) -> usize {
        self.asked.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::Limits;

    #[test]
    fn events_reach_the_kernel_in_the_order_asked_each_at_its_class() {
        let mut k: Kernel<Event> = Kernel::new(Limits::default());
        let mut f = Follow::default();
        // Asked in this order at one tick: the kernel breaks the tie by class, then by order.
        f.after(0, Event::SchedulePass { replica: 0 });
        f.after(0, Event::Arrival { request: 1 });
        f.at(
            0,
            Event::StepDone {
                replica: 0,
                step: 1,
            },
        );
        f.after(0, Event::Arrival { request: 2 });
        f.weak_after(5, Event::LeaseCheck { replica: 0 });
        assert_eq!(f.asked(), 5);
        f.schedule(&mut k).unwrap();
        assert_eq!(f.asked(), 0);
        let mut order = Vec::new();
        while let Some(ev) = k.next_event_or(|| true).unwrap() {
            order.push(ev);
        }
        let want = [
            Event::StepDone {
                replica: 0,
                step: 1,
            },
            Event::Arrival { request: 1 },
            Event::Arrival { request: 2 },
            Event::SchedulePass { replica: 0 },
            Event::LeaseCheck { replica: 0 },
        ];
        assert_eq!(order, want);
    }

    #[test]
    fn a_limit_stops_scheduling_and_leaves_nothing_asked() {
        let limits = Limits {
            queue_len_max: 2,
            ..Limits::default()
        };
        let mut k: Kernel<Event> = Kernel::new(limits);
        let mut f = Follow::default();
        for request in 1..=4 {
            f.after(request, Event::Arrival { request });
        }
        assert!(matches!(
            f.schedule(&mut k),
            Err(LimitError::QueueLen { limit: 2, .. })
        ));
        assert_eq!(f.asked(), 0, "a stopped schedule left events asked for");
        f.open(0); // and a new tick may open over it
        let mut order = Vec::new();
        while let Some(ev) = k.next_event_or(|| true).unwrap() {
            order.push(ev);
        }
        let want = [Event::Arrival { request: 1 }, Event::Arrival { request: 2 }];
        assert_eq!(
            order, want,
            "the events asked for before the limit, in order"
        );
    }

    #[test]
    #[should_panic(expected = "never scheduled")]
    fn a_tick_opened_over_unscheduled_events() {
        let mut f = Follow::default();
        f.after(0, Event::Arrival { request: 1 });
        f.open(1);
    }

    #[test]
    #[should_panic(expected = "time went back")]
    fn a_tick_before_the_last() {
        let mut f = Follow::default();
        f.open(5);
        f.open(4);
    }

    #[test]
    #[should_panic(expected = "asked for in the past")]
    fn an_event_in_the_past() {
        let mut f = Follow::default();
        f.open(5);
        f.at(4, Event::Arrival { request: 1 });
    }
}
