//! Who should hold which shard: bounded rendezvous hashing over the live members.
//!
//! Every replica computes the same answer from the same member list (sorted names, explicit
//! bytes, xxh3-64), so they agree on who tries to acquire what. The Leases, not this
//! function, decide who acts: a disagreement during membership changes only delays a move.
//!
//! Balance: with S shards and R members, the first `S mod R` members (in name order) take
//! `ceil(S/R)` shards and the others `floor(S/R)`, so every member holds one or the other.

use std::collections::BTreeSet;

/// The desired member index of each shard `0..shards`, for members sorted by name.
/// `holders[shard]` is the shard's current holder, if any: a holder that is still a member
/// keeps its shards up to its cap, so a member leaving or joining moves only the shards that
/// must move. Empty when there are no members.
pub fn assign(shards: u32, members: &[String], holders: &[Option<&str>]) -> Vec<usize> {
    if members.is_empty() {
        return Vec::new();
    }
    let count = members.len() as u32;
    let (floor, extra) = (shards / count, shards % count);
    let mut room: Vec<u32> = (0..count).map(|i| floor + u32::from(i < extra)).collect();
    let mut chosen: Vec<Option<usize>> = vec![None; shards as usize];
    for (shard, slot) in chosen.iter_mut().enumerate() {
        let holder = holders.get(shard).copied().flatten();
        if let Some(m) = holder.and_then(|h| members.iter().position(|m| m == h))
            && room[m] > 0
        {
            room[m] -= 1;
            *slot = Some(m);
        }
    }
    chosen
        .into_iter()
        .enumerate()
        .map(|(shard, kept)| {
            kept.unwrap_or_else(|| {
                let mut ranked: Vec<usize> = (0..members.len()).collect();
                ranked.sort_by_key(|&m| std::cmp::Reverse(score(&members[m], shard as u32)));
                // The caps add up to `shards`, so some member always has room.
                let m = ranked.into_iter().find(|&m| room[m] > 0).unwrap_or(0);
                room[m] = room[m].saturating_sub(1);
                m
            })
        })
        .collect()
}

/// The shards `member` would be given if any one other member left, beyond those it is given
/// now: what a hot standby keeps loaded so that a departure moves no data. `placed[shard]` is
/// the shard's member now (as [`assign`] answers, by name); each departure is computed as the
/// others compute it, with the current placement as the holders.
pub fn standby(shards: u32, members: &[String], member: &str, placed: &[&str]) -> BTreeSet<u32> {
    let holders: Vec<Option<&str>> = placed.iter().map(|m| Some(*m)).collect();
    let mut gained = BTreeSet::new();
    for gone in members.iter().filter(|m| *m != member) {
        let rest: Vec<String> = members.iter().filter(|m| *m != gone).cloned().collect();
        for (shard, m) in assign(shards, &rest, &holders).into_iter().enumerate() {
            if rest[m] == member && placed.get(shard).is_none_or(|now| *now != member) {
                gained.insert(shard as u32);
            }
        }
    }
    gained
}

fn score(member: &str, shard: u32) -> u64 {
    xxhash_rust::xxh3::xxh3_64(format!("{member}/{shard}").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> Vec<String> {
        let mut m: Vec<String> = (0..n).map(|i| format!("reloader-{i}")).collect();
        m.sort();
        m
    }

    fn counts(assignment: &[usize], members: usize) -> Vec<u32> {
        let mut c = vec![0; members];
        for &m in assignment {
            c[m] += 1;
        }
        c
    }

    fn holders_of<'a>(assignment: &[usize], names: &'a [String]) -> Vec<Option<&'a str>> {
        assignment.iter().map(|&m| Some(names[m].as_str())).collect()
    }

    #[test]
    fn every_member_holds_floor_or_ceil() {
        for (shards, n) in [(16, 3), (64, 5), (1, 3), (256, 7), (16, 16), (3, 5)] {
            let c = counts(&assign(shards, &members(n), &[]), n);
            let (floor, ceil) = (shards / n as u32, shards.div_ceil(n as u32));
            assert!(c.iter().all(|&x| x == floor || x == ceil), "S={shards} R={n}: {c:?}");
            assert_eq!(c.iter().sum::<u32>(), shards);
        }
    }

    #[test]
    fn everyone_computes_the_same_answer() {
        assert_eq!(assign(64, &members(5), &[]), assign(64, &members(5), &[]));
    }

    #[test]
    fn a_join_moves_only_the_new_members_share() {
        let (four, five) = (members(4), members(5));
        let before = assign(64, &four, &[]);
        let after = assign(64, &five, &holders_of(&before, &four));
        let moved = (0..64).filter(|&s| four[before[s]] != five[after[s]]).count();
        let new_share = counts(&after, 5)[five.iter().position(|m| m == "reloader-4").expect("member")];
        assert_eq!(moved as u32, new_share, "only shards for the new member move");
        assert!(counts(&after, 5).iter().all(|&c| c == 12 || c == 13));
    }

    #[test]
    fn a_leave_moves_only_the_leavers_shards() {
        let (three, two) = (members(3), members(2));
        let before = assign(16, &three, &[]);
        let after = assign(16, &two, &holders_of(&before, &three));
        for shard in 0..16 {
            if three[before[shard]] != "reloader-2" {
                assert_eq!(three[before[shard]], two[after[shard]], "shard {shard} of a remaining member moved");
            }
        }
        assert!(counts(&after, 2).iter().all(|&c| c == 8));
    }

    #[test]
    fn a_standby_holds_what_any_departure_gives_it() {
        let three = members(3);
        let placed_index = assign(16, &three, &[]);
        let placed: Vec<&str> = placed_index.iter().map(|&m| three[m].as_str()).collect();
        for me in &three {
            let standby = standby(16, &three, me, &placed);
            assert!(standby.iter().all(|s| placed[*s as usize] != me), "{me}: none of its own shards");
            for gone in three.iter().filter(|m| *m != me) {
                let rest: Vec<String> = three.iter().filter(|m| *m != gone).cloned().collect();
                let after = assign(16, &rest, &holders_of(&placed_index, &three));
                for (shard, m) in after.iter().enumerate() {
                    if rest[*m] == *me && placed[shard] != me {
                        assert!(standby.contains(&(shard as u32)), "{me} gains shard {shard} when {gone} leaves");
                    }
                }
            }
            // Each of the two others' shards is split between the two who stay: about half.
            assert!((4..=11).contains(&standby.len()), "{me}: {standby:?}");
        }
        assert!(
            standby(16, &members(1), "reloader-0", &["reloader-0"; 16]).is_empty(),
            "alone: nobody to stand by for"
        );
    }

    #[test]
    fn no_members_no_assignment() {
        assert!(assign(16, &[], &[]).is_empty());
    }
}
