//! The programs' counters as userspace reads them: one total per `Counter`, summed over CPUs
//! by `KernelCapture::counters`.

use observer_records::{COUNTER_COUNT, Counter};

/// Kernel-side counters, summed over CPUs; indexed by `Counter`, serialised as an object keyed
/// by `Counter::name`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelCounters([u64; COUNTER_COUNT as usize]);

impl KernelCounters {
    pub fn iter(&self) -> impl Iterator<Item = (Counter, u64)> + '_ {
        Counter::ALL
            .into_iter()
            .map(|counter| (counter, self[counter]))
    }
}

impl std::ops::Index<Counter> for KernelCounters {
    type Output = u64;

    fn index(&self, counter: Counter) -> &u64 {
        &self.0[counter as usize]
    }
}

impl std::ops::IndexMut<Counter> for KernelCounters {
    fn index_mut(&mut self, counter: Counter) -> &mut u64 {
        &mut self.0[counter as usize]
    }
}

impl serde::Serialize for KernelCounters {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(Counter::ALL.len()))?;
        for (counter, value) in self.iter() {
            map.serialize_entry(counter.name(), &value)?;
        }
        map.end()
    }
}
