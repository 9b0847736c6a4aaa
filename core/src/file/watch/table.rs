//! The holder's watch, its table: which watch is whose, which acquisitions
//! are still setting one, and when each lease's content watch starts,
//! kept so that a lease's own entries are found without looking at every
//! one (a process may hold 10,000 leases).

use super::*;

impl WState {
    /// The entry of watch `wd`, now `shared`'s.
    pub(super) fn own(&mut self, wd: i32, shared: &Arc<Shared>) -> &mut Entry {
        let wds = self
            .by_lease
            .entry(Arc::as_ptr(shared) as usize)
            .or_default();
        if !wds.contains(&wd) {
            wds.push(wd);
        }
        let e = self.entries.entry(wd).or_default();
        e.lease = Some(Arc::downgrade(shared));
        e
    }

    /// Start watching writes to `wd`'s file at `at`.
    pub(super) fn content_at(&mut self, wd: i32, at: Instant) {
        if let Some(e) = self.entries.get_mut(&wd) {
            e.content_at = Some(at);
        }
        // In order of time: acquisitions on other threads may come in a
        // moment apart.
        let i = self.content_due.iter().rposition(|(t, _)| *t <= at);
        self.content_due.insert(i.map_or(0, |i| i + 1), (at, wd));
        // Only the thread takes entries off; while it is paused (or could
        // not start) a loop of acquire and release must not grow this.
        if self.content_due.len() > 2 * self.entries.len() + 64 {
            let entries = &self.entries;
            self.content_due
                .retain(|(t, w)| entries.get(w).is_some_and(|e| e.content_at == Some(*t)));
        }
    }

    /// The next content watch to start: when. Those passed over first.
    pub(super) fn next_content(&mut self) -> Option<Instant> {
        while let Some(&(at, wd)) = self.content_due.front() {
            if self
                .entries
                .get(&wd)
                .is_some_and(|e| e.content_at == Some(at))
            {
                return Some(at);
            }
            self.content_due.pop_front();
        }
        None
    }

    /// One acquisition that set watch `wd` finished (or gave up).
    pub(super) fn finish(&mut self, wd: i32) {
        if let Some(e) = self.entries.get_mut(&wd) {
            if e.pending > 0 {
                e.pending -= 1;
                self.pending = self.pending.saturating_sub(1);
            }
        }
    }

    /// Watch `wd` is no more (or no longer wanted).
    pub(super) fn remove(&mut self, wd: i32) {
        let Some(e) = self.entries.remove(&wd) else {
            return;
        };
        self.pending = self.pending.saturating_sub(e.pending);
        let Some(l) = e.lease else { return };
        let at = l.as_ptr() as usize;
        if let Some(wds) = self.by_lease.get_mut(&at) {
            wds.retain(|w| *w != wd);
            if wds.is_empty() {
                self.by_lease.remove(&at);
            }
        }
    }
}
