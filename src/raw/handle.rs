//! The counted handle to a value the cache hands out: [`Handle`], and its [`WeakHandle`].

#![forbid(unsafe_code)]

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::{Arc, Weak};

/// A counted, shared handle to a value from a cache: what `get`, `insert`, `remove` and the
/// `get_or_*` methods hand out.
///
/// It works like [`Arc<V>`]: it dereferences to the value, a clone is one more count of the
/// same value, and the value stays alive while any handle to it does, also after the entry
/// left the cache (removed, replaced, evicted or cleared). Comparisons, hashing and
/// formatting go to the value. It is `Send` and `Sync` when `V` is.
///
/// To hand a value out as a [`std::sync::Arc`], store the `Arc` as the cache's value
/// (`Cache<K, Arc<T>>`): `handle.as_ref().clone()` is then one count of the `Arc`.
pub struct Handle<V> {
    value: Arc<V>,
}

impl<V> Handle<V> {
    /// A handle to a value of its own, not in any cache (for an uncached result, or a test).
    pub fn new(value: V) -> Self {
        Self {
            value: Arc::new(value),
        }
    }

    /// Whether two handles point at the same value (not merely equal ones).
    pub fn ptr_eq(this: &Self, other: &Self) -> bool {
        Arc::ptr_eq(&this.value, &other.value)
    }

    /// A weak handle to the same value: it does not keep the value alive, and
    /// [`WeakHandle::upgrade`] gives the value back while some handle still holds it.
    pub fn downgrade(this: &Self) -> WeakHandle<V> {
        WeakHandle {
            value: Arc::downgrade(&this.value),
        }
    }

    /// A handle from an `Arc` the engine made.
    pub(crate) fn from_arc(value: Arc<V>) -> Self {
        Self { value }
    }
}

impl<V> Clone for Handle<V> {
    fn clone(&self) -> Self {
        Self {
            value: Arc::clone(&self.value),
        }
    }
}

impl<V> Deref for Handle<V> {
    type Target = V;

    #[inline]
    fn deref(&self) -> &V {
        &self.value
    }
}

impl<V> AsRef<V> for Handle<V> {
    fn as_ref(&self) -> &V {
        self
    }
}

impl<V> Borrow<V> for Handle<V> {
    fn borrow(&self) -> &V {
        self
    }
}

impl<V: fmt::Debug> fmt::Debug for Handle<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<V: fmt::Display> fmt::Display for Handle<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&**self, f)
    }
}

impl<V: PartialEq> PartialEq for Handle<V> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<V: Eq> Eq for Handle<V> {}

impl<V: PartialOrd> PartialOrd for Handle<V> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        (**self).partial_cmp(&**other)
    }
}

impl<V: Ord> Ord for Handle<V> {
    fn cmp(&self, other: &Self) -> Ordering {
        (**self).cmp(&**other)
    }
}

impl<V: Hash> Hash for Handle<V> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (**self).hash(state);
    }
}

/// A handle that does not keep its value alive; see [`Handle::downgrade`].
pub struct WeakHandle<V> {
    value: Weak<V>,
}

impl<V> WeakHandle<V> {
    /// The value, if some [`Handle`] (the cache's own included) still holds it.
    pub fn upgrade(&self) -> Option<Handle<V>> {
        self.value.upgrade().map(Handle::from_arc)
    }
}

impl<V> Clone for WeakHandle<V> {
    fn clone(&self) -> Self {
        Self {
            value: Weak::clone(&self.value),
        }
    }
}

impl<V> fmt::Debug for WeakHandle<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(WeakHandle)")
    }
}
