//! Who should hold which shard: bounded rendezvous hashing over the live members.
//!
//! Every replica computes the same answer from the same member list (sorted names, explicit
//! bytes, xxh3-64), so they agree on who tries to acquire what. The Leases, not this
//! function, decide who acts: a disagreement during membership changes only delays a move.
//!
//! Balance: with S shards and R members, the first `S mod R` members (in name order) take
//! `ceil(S/R)` shards and the others `floor(S/R)`, so every member holds one or the other.

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
    fn no_members_no_assignment() {
        assert!(assign(16, &[], &[]).is_empty());
    }
}
