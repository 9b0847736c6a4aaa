//! The holder's watch, kept up: the watches that follow from what is held
//! (directory chains, missing files, polled leases tried again) and the
//! content watch of leases held a while.

use super::*;

impl Watcher {
    /// Start watching writes to the files of leases held long enough, and
    /// put right what was written meanwhile.
    pub(super) fn watch_content(&self, now: Instant) {
        let due: Vec<(i32, Arc<Shared>, Key)> = {
            let mut st = self.state();
            let mut due = Vec::new();
            while let Some(&(at, wd)) = st.content_due.front() {
                if at > now {
                    break;
                }
                st.content_due.pop_front();
                let Some(e) = st.entries.get_mut(&wd) else {
                    continue;
                };
                if e.content_at != Some(at) {
                    continue; // released, or held again since
                }
                e.content_at = None;
                if let (Some(s), Some(key)) = (e.lease.as_ref().and_then(Weak::upgrade), e.key) {
                    due.push((wd, s, key));
                }
            }
            if !due.is_empty() {
                st.content_ran = Some(now);
            }
            due
        };
        let Some(events) = self.state().events.as_ref().map(|f| f.as_raw_fd()) else {
            return;
        };
        // SAFETY: only this thread closes the instance.
        let events = unsafe { BorrowedFd::borrow_raw(events) };
        for (wd, s, key) in due {
            let watched = {
                let st = s.state();
                if !matches!(st.phase, Phase::Held) {
                    continue;
                }
                // The descriptor stays open while the lease state is held.
                st.anchors
                    .iter()
                    .find(|a| a.key == key)
                    .map(|a| fsevents::watch_held(events, a.fd, true))
            };
            match watched {
                Some(Ok(w)) => {
                    // (The same watch: the same file.)
                    for d in [wd, w] {
                        if let Some(e) = self.state().entries.get_mut(&d) {
                            e.content = true;
                        }
                    }
                    anchor::check(&s, true);
                }
                Some(Err(_)) => self.poll_instead(&s),
                None => {}
            }
        }
    }

    /// The watches that follow from what happened: the directory chains of
    /// held leases, the directories where a lease file is missing, and
    /// another try at watching the leases that are polled.
    pub(super) fn upkeep(&self, now: Instant) {
        let Some(events) = self.state().events.as_ref().map(|f| f.as_raw_fd()) else {
            // Nothing can be watched: the leases are polled, and their
            // chains are asked for again once an instance can be had.
            let mut st = self.state();
            st.new_dirs.clear();
            st.chains_wanted = false;
            drop(st);
            self.upgrade(now);
            return;
        };
        // SAFETY: only this thread closes the instance.
        let events = unsafe { BorrowedFd::borrow_raw(events) };
        let new_dirs = std::mem::take(&mut self.state().new_dirs);
        for (dir_path, key) in new_dirs {
            let r = self.state().dirs.chain(events, &dir_path, key);
            if !matches!(r, Ok(true)) {
                // Moved already, or no watch to be had: every lease is
                // looked at, and polled where it must be.
                self.state().chains_wanted = true;
            }
        }
        if std::mem::take(&mut self.state().chains_wanted) {
            for s in self.held() {
                if !matches!(s.state().phase, Phase::Held) {
                    continue;
                }
                for path in s.paths() {
                    let dir_path = crate::path::parent_of(path);
                    let Ok(st) = crate::platform::stat::stat(dir_path) else {
                        continue; // gone: the lease's own check handles that
                    };
                    let r = self
                        .state()
                        .dirs
                        .chain(events, dir_path, (st.st_dev, st.st_ino));
                    match r {
                        Ok(true) => {}
                        Ok(false) => self.state().asked.push(Arc::downgrade(&s)),
                        Err(_) => self.poll_instead(&s),
                    }
                }
            }
        }
        let failing: Vec<Arc<Shared>> = {
            let st = self.state();
            st.retry.iter().filter_map(|(w, _)| w.upgrade()).collect()
        };
        let missing: Vec<std::path::PathBuf> = failing
            .iter()
            .filter_map(|s| deepest_existing(&s.lease_path))
            .collect();
        let mut st = self.state();
        let (added, dropped) = st.dirs.set_creating(events, &missing);
        if added {
            // Watched from now: what appeared before is looked at now.
            st.asked.extend(failing.iter().map(Arc::downgrade));
        }
        st.chains_wanted |= dropped;
        drop(st);
        self.upgrade(now);
    }

    /// A lease inotify cannot cover: look at it on a timer.
    pub(super) fn poll_instead(&self, s: &Arc<Shared>) {
        let mut st = self.state();
        if !st
            .polled
            .iter()
            .any(|w| ptr::eq(w.as_ptr(), Arc::as_ptr(s)))
        {
            st.polled.push(Arc::downgrade(s));
        }
        let now = Instant::now();
        st.next_poll.get_or_insert(now + POLL_EVERY);
        st.next_upgrade.get_or_insert(now + UPGRADE_EVERY);
    }

    /// Try again to watch the polled leases (the user's inotify limits may
    /// have room again).
    pub(super) fn upgrade(&self, now: Instant) {
        let polled: Vec<Arc<Shared>> = {
            let mut st = self.state();
            if st.polled.is_empty() {
                st.next_upgrade = None;
                st.next_poll = None;
                return;
            }
            if st.next_upgrade.is_some_and(|t| t > now) {
                return;
            }
            st.next_upgrade = Some(now + UPGRADE_EVERY);
            st.polled.iter().filter_map(Weak::upgrade).collect()
        };
        for s in polled {
            if self.watch_all(&s) {
                let mut st = self.state();
                st.polled.retain(|w| !ptr::eq(w.as_ptr(), Arc::as_ptr(&s)));
                st.chains_wanted = true;
            }
        }
    }

    /// Watch every file of a lease (writes included: it has been held a
    /// while). True when all are watched.
    pub(super) fn watch_all(&self, s: &Arc<Shared>) -> bool {
        let sst = s.state();
        if !matches!(sst.phase, Phase::Held) {
            return true;
        }
        let mut st = self.state();
        let Some(events) = self.instance(&mut st).map(|f| f.as_raw_fd()) else {
            return false;
        };
        // SAFETY: this thread holds the state lock; the instance stays.
        let events = unsafe { BorrowedFd::borrow_raw(events) };
        for a in &sst.anchors {
            match fsevents::watch_held(events, a.fd, true) {
                Ok(wd) => {
                    let e = st.own(wd, s);
                    e.key = Some(a.key);
                    e.content = true;
                }
                Err(_) => return false,
            }
        }
        true
    }
}

/// The deepest directory of `lease_path` that exists now (where its
/// missing parts will be made).
fn deepest_existing(lease_path: &std::path::Path) -> Option<std::path::PathBuf> {
    let mut d = crate::path::parent_of(lease_path);
    loop {
        if std::fs::metadata(d).is_ok_and(|m| m.is_dir()) {
            return Some(d.to_path_buf());
        }
        let up = d.parent()?;
        if up.as_os_str().is_empty() {
            return None;
        }
        d = up;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn deepest_existing_directory() {
        let d = tempfile::tempdir().unwrap();
        let lease = d.path().join("a/b/app.db.backend-lease");
        assert_eq!(super::deepest_existing(&lease).as_deref(), Some(d.path()));
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        assert_eq!(super::deepest_existing(&lease), Some(d.path().join("a/b")));
    }
}
