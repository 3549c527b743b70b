//! Driver failures injected on purpose, for tests of the failure paths
//! ([`VulkanAllocator::__inject`](super::VulkanAllocator::__inject)): the call that would
//! return the failure returns it instead, with the same effect.

#![forbid(unsafe_code)]

use crate::sync::{AtomicU64, Ordering};
use ash::vk;

/// Where an injected driver failure strikes (`VulkanAllocator::__inject`).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// A device-memory allocation (a buffer of its own or a block of small buffers).
    Allocation,
    /// A transfer's submission to the queue (one chunk of an upload through staging).
    Transfer,
    /// A wait for a transfer's fence: `vk::Result::TIMEOUT` there makes the wait report a
    /// timeout at once, while the transfer runs on.
    Wait,
}

/// The top two bits of an armed word: where the fault strikes (0: nothing armed).
fn site(at: Fault) -> u64 {
    match at {
        Fault::Allocation => 1,
        Fault::Transfer => 2,
        Fault::Wait => 3,
    }
}

/// The injected fault, if any: where, how many more calls there it lets through, and the
/// result it returns. A test hook; one word, so that the paths it guards take no lock.
#[derive(Default)]
pub(super) struct Faults(AtomicU64);

impl Faults {
    pub(super) fn arm(&self, at: Fault, skip: u32, result: vk::Result) {
        let word =
            site(at) << 62 | u64::from(result.as_raw() as u32) << 30 | u64::from(skip.min(1 << 29));
        // Relaxed: a test hook, armed before the calls it should strike.
        self.0.store(word, Ordering::Relaxed);
    }

    /// The result the call at `at` fails with now, counting the call; `None` to go on.
    pub(super) fn strike(&self, at: Fault) -> Option<vk::Result> {
        let site = site(at);
        // Relaxed: as in `arm`; the swap's atomicity alone makes one call the one struck.
        let mut word = self.0.load(Ordering::Relaxed);
        loop {
            if word >> 62 != site {
                return None;
            }
            let skip = word & ((1 << 30) - 1);
            let (next, hit) = if skip == 0 {
                (0, true)
            } else {
                (word - 1, false)
            };
            match self
                .0
                .compare_exchange(word, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) if hit => return Some(vk::Result::from_raw((word >> 30) as u32 as i32)),
                Ok(_) => return None,
                Err(now) => word = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_strikes_once_after_its_skips_and_only_at_its_site() {
        let f = Faults::default();
        assert_eq!(f.strike(Fault::Transfer), None, "nothing armed");
        f.arm(Fault::Transfer, 2, vk::Result::ERROR_DEVICE_LOST);
        assert_eq!(f.strike(Fault::Allocation), None, "another site");
        assert_eq!(f.strike(Fault::Transfer), None);
        assert_eq!(f.strike(Fault::Transfer), None);
        assert_eq!(
            f.strike(Fault::Transfer),
            Some(vk::Result::ERROR_DEVICE_LOST)
        );
        assert_eq!(f.strike(Fault::Transfer), None, "once");
        f.arm(Fault::Allocation, 0, vk::Result::ERROR_OUT_OF_DEVICE_MEMORY);
        assert_eq!(
            f.strike(Fault::Allocation),
            Some(vk::Result::ERROR_OUT_OF_DEVICE_MEMORY)
        );
    }
}
