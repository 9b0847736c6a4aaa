//! Reading the soak's logs and judging them.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde_json::{json, Value};

/// One critical section, as a worker logged it.
#[derive(Clone, Copy, Debug)]
struct Section {
    pid: u32,
    generation: u64,
    start: u64,
    end: u64,
    /// `ensure_held` passed at its end.
    held: bool,
    /// The detector flock was free at its start.
    alone: bool,
}

impl Section {
    fn parse(line: &str) -> Option<Section> {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() != 7 || f[0] != "S" {
            return None;
        }
        Some(Section {
            pid: f[1].parse().ok()?,
            generation: f[2].parse().ok()?,
            start: f[3].parse().ok()?,
            end: f[4].parse().ok()?,
            held: f[5] == "1",
            alone: f[6] == "1",
        })
    }
    fn json(&self) -> Value {
        json!({"pid": self.pid, "generation": self.generation, "start_ns": self.start,
               "end_ns": self.end, "ensure_held_passed": self.held})
    }
}

pub struct Report {
    sections: usize,
    tamperings: u64,
    errors: BTreeMap<String, usize>,
    /// Pairs of sections that overlap in time.
    overlaps: usize,
    /// ... of which the first still passed `ensure_held` at its end.
    silent: Vec<(Section, Section)>,
    /// Sections that found the detector taken.
    detector_hits: usize,
    repeated: Vec<u64>,
    /// Sections whose generation is not above one of a section that ended
    /// before they began.
    back: Vec<(Section, Section)>,
    malformed: usize,
}

pub fn analyse(dir: &Path, procs: u64, tamperers: u64) -> Result<Report, String> {
    let mut all = Vec::new();
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    let mut malformed = 0;
    for i in 0..procs {
        let p = dir.join(format!("sections.{i}"));
        let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        for line in text.lines() {
            if let Some(s) = Section::parse(line) {
                all.push(s);
            } else if let Some(rest) = line.strip_prefix("E ") {
                let kind = rest.split(' ').next().unwrap_or("?").to_owned();
                *errors.entry(kind).or_default() += 1;
            } else {
                malformed += 1;
            }
        }
    }
    let mut tamperings = 0;
    for i in 0..tamperers {
        let p = dir.join(format!("tampered.{i}"));
        let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        tamperings += text
            .trim()
            .parse::<u64>()
            .map_err(|_| format!("{}: not a count", p.display()))?;
    }
    all.sort_by_key(|s| (s.start, s.end));
    let mut overlaps = 0;
    let mut silent = Vec::new();
    // Sections still open at the current start (few: overlaps are rare).
    let mut open: Vec<Section> = Vec::new();
    for s in &all {
        open.retain(|o| o.end > s.start);
        for o in &open {
            overlaps += 1;
            if o.held {
                silent.push((*o, *s));
            }
        }
        open.push(*s);
    }
    let mut seen: HashMap<u64, usize> = HashMap::new();
    for s in &all {
        *seen.entry(s.generation).or_default() += 1;
    }
    let mut repeated: Vec<u64> = seen
        .into_iter()
        .filter(|&(g, n)| n > 1 && g != 0)
        .map(|(g, _)| g)
        .collect();
    repeated.sort_unstable();
    // The highest generation among sections that ended before each start.
    let mut by_end = all.clone();
    by_end.sort_by_key(|s| s.end);
    let mut back = Vec::new();
    let mut best: Option<Section> = None;
    let mut k = 0;
    for s in &all {
        while k < by_end.len() && by_end[k].end < s.start {
            if best.is_none_or(|b| by_end[k].generation > b.generation) {
                best = Some(by_end[k]);
            }
            k += 1;
        }
        if let Some(b) = best {
            if s.generation <= b.generation && s.generation != 0 {
                back.push((b, *s));
            }
        }
    }
    Ok(Report {
        sections: all.len(),
        tamperings,
        errors,
        overlaps,
        silent,
        detector_hits: all.iter().filter(|s| !s.alone).count(),
        repeated,
        back,
        malformed,
    })
}

impl Report {
    /// Every check passed, and the run was not vacuous: at least `least`
    /// sections happened, and the lease file was tampered with.
    pub fn passed(&self, least: u64) -> bool {
        self.silent.is_empty()
            && self.repeated.is_empty()
            && self.back.is_empty()
            && self.malformed == 0
            && self.sections as u64 >= least
            && self.tamperings > 0
    }

    pub fn to_json(&self) -> Value {
        let pairs = |v: &[(Section, Section)]| -> Vec<Value> {
            v.iter()
                .take(5)
                .map(|(a, b)| json!([a.json(), b.json()]))
                .collect()
        };
        json!({
            "sections": self.sections,
            "tamperings": self.tamperings,
            "errors": self.errors,
            "overlaps": self.overlaps,
            "silent_overlaps": self.silent.len(),
            "silent_examples": pairs(&self.silent),
            "detector_hits": self.detector_hits,
            "repeated_generations": self.repeated.len(),
            "repeated_examples": self.repeated.iter().take(5).collect::<Vec<_>>(),
            "generations_back": self.back.len(),
            "back_examples": pairs(&self.back),
            "malformed_lines": self.malformed,
        })
    }
}
