//! What changed in foca's membership during one call, without looking at
//! the whole membership.
//!
//! foca has no notification for "suspect", and its full membership is a
//! list as long as the cluster. But foca encodes every member state it
//! applies, at the moment it applies it, to gossip it on
//! (`handle_apply_summary` → `serialize_member`); the only other members
//! it encodes are copies of current states (the feed it sends a joining
//! member). So a codec that notes each member it encodes sees every change
//! of the view, and nothing older than the view: [`WatchingCodec`] is
//! foca's postcard codec plus that note. A member foca replaces by a newer
//! identity at the same address is reported by foca's `Rename`
//! notification, which the caller hands to the tracker with the notes.
//!
//! The cost of a call is then in proportion to the members it touched (the
//! updates a datagram carried), not to the size of the cluster.

use std::cell::RefCell;
use std::rc::Rc;

use bytes::{Buf, BufMut};
use foca::{Codec, Header, Member, PostcardCodec};

use super::identity::SwimIdentity;

/// The members encoded since the last [`Changes::take`], shared between
/// the codec (inside foca) and the adapter that drains them.
#[derive(Clone, Debug, Default)]
pub struct Changes(Rc<RefCell<Vec<Member<SwimIdentity>>>>);

impl Changes {
    /// Takes the notes made since the last call, oldest first.
    pub fn take(&self) -> Vec<Member<SwimIdentity>> {
        std::mem::take(&mut *self.0.borrow_mut())
    }

    fn note(&self, member: &Member<SwimIdentity>) {
        self.0.borrow_mut().push(member.clone());
    }
}

/// foca's postcard codec, noting every member it encodes when watched.
#[derive(Debug)]
pub struct WatchingCodec {
    inner: PostcardCodec,
    changes: Option<Changes>,
}

impl WatchingCodec {
    /// A codec that notes into the returned [`Changes`].
    pub fn watched() -> (Self, Changes) {
        let changes = Changes::default();
        let codec = Self {
            inner: PostcardCodec,
            changes: Some(changes.clone()),
        };
        (codec, changes)
    }

    /// A codec that notes nothing (a member whose view nobody reads).
    pub fn unwatched() -> Self {
        Self {
            inner: PostcardCodec,
            changes: None,
        }
    }
}

impl Codec<SwimIdentity> for WatchingCodec {
    type Error = <PostcardCodec as Codec<SwimIdentity>>::Error;

    fn encode_header(
        &mut self,
        header: &Header<SwimIdentity>,
        buf: impl BufMut,
    ) -> Result<(), Self::Error> {
        self.inner.encode_header(header, buf)
    }

    fn decode_header(&mut self, buf: impl Buf) -> Result<Header<SwimIdentity>, Self::Error> {
        self.inner.decode_header(buf)
    }

    fn encode_member(
        &mut self,
        member: &Member<SwimIdentity>,
        buf: impl BufMut,
    ) -> Result<(), Self::Error> {
        if let Some(changes) = &self.changes {
            changes.note(member);
        }
        self.inner.encode_member(member, buf)
    }

    fn decode_member(&mut self, buf: impl Buf) -> Result<Member<SwimIdentity>, Self::Error> {
        self.inner.decode_member(buf)
    }
}
