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
//!
//! The codec is also where identities enter foca from the wire: it gives
//! each one it decodes the member's [`Arbiter`], by which foca's address
//! conflicts are decided (foca asks the identities and gives them nothing
//! else).

use std::cell::RefCell;
use std::rc::Rc;

use bytes::{Buf, BufMut};
use foca::{Codec, Header, Member, PostcardCodec};

use super::identity::{Arbiter, SwimIdentity};

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

/// foca's postcard codec, noting every member it encodes when watched,
/// and giving every identity it decodes its member's arbiter.
#[derive(Debug)]
pub struct WatchingCodec {
    inner: PostcardCodec,
    changes: Option<Changes>,
    /// None: the member decides by generation alone (nothing to hand).
    arbiter: Option<Arbiter>,
}

impl WatchingCodec {
    /// A codec that notes into the returned [`Changes`], for a member
    /// that decides address conflicts by `arbiter`.
    pub fn watched(arbiter: Arbiter) -> (Self, Changes) {
        let changes = Changes::default();
        let codec = Self {
            inner: PostcardCodec,
            changes: Some(changes.clone()),
            arbiter: Some(arbiter),
        };
        (codec, changes)
    }

    /// A codec that notes nothing (a member whose view nobody reads, which
    /// decides address conflicts by generation).
    pub fn unwatched() -> Self {
        Self {
            inner: PostcardCodec,
            changes: None,
            arbiter: None,
        }
    }

    /// `id`, deciding its address conflicts by this member's arbiter.
    fn judged(&self, id: SwimIdentity) -> SwimIdentity {
        match &self.arbiter {
            Some(arbiter) => id.judged_by(arbiter),
            None => id,
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
        use foca::Message;
        let Header {
            src,
            src_incarnation,
            dst,
            message,
        } = self.inner.decode_header(buf)?;
        let message = match message {
            Message::PingReq {
                target,
                probe_number,
            } => Message::PingReq {
                target: self.judged(target),
                probe_number,
            },
            Message::IndirectPing {
                origin,
                probe_number,
            } => Message::IndirectPing {
                origin: self.judged(origin),
                probe_number,
            },
            Message::IndirectAck {
                target,
                probe_number,
            } => Message::IndirectAck {
                target: self.judged(target),
                probe_number,
            },
            Message::ForwardedAck {
                origin,
                probe_number,
            } => Message::ForwardedAck {
                origin: self.judged(origin),
                probe_number,
            },
            other => other,
        };
        Ok(Header {
            src: self.judged(src),
            src_incarnation,
            dst: self.judged(dst),
            message,
        })
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
        let member: Member<SwimIdentity> = self.inner.decode_member(buf)?;
        if self.arbiter.is_none() {
            return Ok(member);
        }
        Ok(Member::new(
            self.judged(member.id().clone()),
            member.incarnation(),
            member.state(),
        ))
    }
}
